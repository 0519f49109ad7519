"""The matrix product every kernel uses, and the interpreter's bf16 gap it papers over."""
import triton
import triton.language as tl


@triton.jit
def dot(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation. UPCAST (CPU interpreter only): Triton 3.6's interpreter
    multiplies bf16 tiles as their raw uint16 bits, so widen them first; the operands are
    already rounded to their storage dtype, so only the summation order differs from the GPU."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT_PRECISION)
