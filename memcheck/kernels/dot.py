"""The matrix product every kernel uses (and the interpreter's bf16 gap it papers over), and the online-softmax
update every attention kernel's tile loop makes."""
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


@triton.jit
def softmax_update(s, qk_scale, toks, end, q_pos, m, l, MASK_END: tl.constexpr, CAUSAL: tl.constexpr,
                   EMPTY_ROWS: tl.constexpr = False):
    """One tile of the online softmax: raw scores s [rows, tile] of tokens `toks`, times qk_scale in log2 units;
    with MASK_END those >= end masked out (a tile that may run past the end) and, with CAUSAL, those past each row's
    q_pos -> (new max, new sum, p, alpha). The caller rescales its accumulator by alpha and adds p @ V. The max is
    taken before scaling (the same, as qk_scale > 0), so scale and subtraction are one FMA an element: on Hopper
    Triton runs a prefill tile's softmax after its products, not beside them, so its arithmetic adds to the time.
    Every row sees token 0 in the first tile, so the max is finite after; EMPTY_ROWS where a row may have seen no
    token yet (a window of the context that starts past it): its max stays -inf, its sum and weights 0."""
    if MASK_END:
        s = tl.where((toks < end)[None, :], s, float("-inf"))
    if CAUSAL:
        s = tl.where(toks[None, :] <= q_pos[:, None], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
    m_ref = m_new
    if EMPTY_ROWS:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(s * qk_scale - m_ref[:, None])
    return m_new, l * alpha + tl.sum(p, 1), p, alpha
