"""The gated activation of SiLU MLPs, silu(gate) * up, in one Triton launch and in place: the product
overwrites the gate half of the [gate | up] projection rows (torch: a silu kernel and a product).
Roundings as torch's: silu in float32 cast to the dtype, then the product in the dtype."""
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter

fix_triton_interpreter()
BLOCK = 1024


@triton.jit
def _silu_mul(gu_ptr, stride_row, INTER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate_ptr = gu_ptr + row * stride_row + cols
    g = tl.load(gate_ptr, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_ptr + INTER, mask=mask, other=0.0).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(gu_ptr.dtype.element_ty).to(tl.float32)
    tl.store(gate_ptr, (act * u).to(gu_ptr.dtype.element_ty), mask=mask)


def silu_mul_(gate_up):
    """gate_up [T, 2 x inter] (rows with unit column stride) -> its gate half [T, inter], now silu(gate) * up."""
    rows, two_inter = gate_up.shape
    inter = two_inter // 2
    assert gate_up.stride(-1) == 1
    if rows:
        _silu_mul[(rows, triton.cdiv(inter, BLOCK))](gate_up, gate_up.stride(0), INTER=inter, BLOCK=BLOCK)
    return gate_up[:, :inter]
