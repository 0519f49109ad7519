"""Rotary position embedding of one tensor of heads in one Triton launch (torch: ~8 small kernels of
slices, products, sums and a concatenation). One program per token, all its heads.

neox (Llama, Qwen2): halves rotated, in the model dtype, each product and sum rounded to it as torch does.
interleaved (DeepSeek): (even, odd) pairs rotated in float32, written evens then odds (the layout the
torch reference writes: a fixed permutation that leaves every q.k product unchanged)."""
import torch
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2

fix_triton_interpreter()


@triton.jit
def rotate(x1, x2, c, s, dt, INTERLEAVED: tl.constexpr):
    """The rotated halves (o1, o2) of pairs (x1, x2) by cos c and sin s, in the roundings of the layout."""
    if INTERLEAVED:
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
    else:  # each product and the sum rounded to the dtype, as torch's elementwise ops on that dtype do
        x1c = (x1.to(tl.float32) * c.to(tl.float32)).to(dt).to(tl.float32)
        x2s = (x2.to(tl.float32) * s.to(tl.float32)).to(dt).to(tl.float32)
        x2c = (x2.to(tl.float32) * c.to(tl.float32)).to(dt).to(tl.float32)
        x1s = (x1.to(tl.float32) * s.to(tl.float32)).to(dt).to(tl.float32)
        o1 = x1c - x2s
        o2 = x2c + x1s
    return o1, o2


@triton.jit
def load_pairs(row, i, mask, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """(x1, x2) of a row's rotary dims: (even, odd) in float32 if interleaved, else the halves as stored."""
    if INTERLEAVED:
        x1 = tl.load(row + 2 * i, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + 2 * i + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        x1 = tl.load(row + i, mask=mask, other=0.0)
        x2 = tl.load(row + HALF + i, mask=mask, other=0.0)
    return x1, x2


@triton.jit
def rotate_into(src, dst, i, mask, c, s, dt, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The rotary dims of the rows at src (pointers to each row's start, i the pair index) rotated by c, s in the
    roundings of the layout, stored at dst (first halves, then second halves; rounded to dt, then dst's type)."""
    x1, x2 = load_pairs(src, i, mask, HALF, INTERLEAVED)
    o1, o2 = rotate(x1, x2, c, s, dt, INTERLEAVED)
    tl.store(dst + i, o1.to(dt).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + i, o2.to(dt).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rotary(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_x_tok, stride_x_head, stride_cs, stride_o_tok, stride_o_head,
            HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
            INTERLEAVED: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    i = tl.arange(0, HALF_PAD)
    mask = (heads < HEADS)[:, None] & (i < HALF)[None, :]
    c = tl.load(cos_ptr + tok * stride_cs + i, mask=i < HALF, other=0.0)[None, :]
    s = tl.load(sin_ptr + tok * stride_cs + i, mask=i < HALF, other=0.0)[None, :]
    rotate_into(x_ptr + tok * stride_x_tok + heads[:, None] * stride_x_head,
                out_ptr + tok * stride_o_tok + heads[:, None] * stride_o_head, i[None, :], mask, c, s,
                out_ptr.dtype.element_ty, HALF, INTERLEAVED)


def rotary(x, cos, sin, interleaved: bool):
    """x [T, heads, D] (unit stride in D) -> rotated [T, heads, D], contiguous, x's dtype. cos/sin [T, D/2]:
    the model dtype for neox, float32 for interleaved."""
    tokens, heads, dim = x.shape
    assert x.stride(-1) == 1 and cos.stride(-1) == 1 and cos.stride() == sin.stride()
    out = torch.empty(tokens, heads, dim, dtype=x.dtype, device=x.device)
    if tokens:
        _rotary[(tokens,)](x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), out.stride(0), out.stride(1),
                           HEADS=heads, HEADS_PAD=next_pow2(heads), HALF=dim // 2, HALF_PAD=next_pow2(dim // 2),
                           INTERLEAVED=interleaved, num_warps=4,
                           enable_fp_fusion=False)  # no fused multiply-adds: torch's float32 roundings
    return out
