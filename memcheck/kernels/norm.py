"""RMSNorm, optionally after adding the residual, in one Triton launch (torch runs ~8 small kernels:
the float copy, square, mean, add, rsqrt, products and casts). One program per row.

transformers' order of roundings is kept: the normalised row in float32 is cast to the input dtype
before the weight multiplies it (in that dtype), so bf16 results match the torch reference."""
import torch
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2

fix_triton_interpreter()


@triton.jit
def normalise(x, w, eps, WIDTH: tl.constexpr):
    """transformers' RMSNorm of one row x (padding zeros) in x's dtype: float32 statistics, the normalised
    row rounded to the dtype before the weight multiplies it. Returns float32 holding dtype values."""
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / WIDTH + eps)
    return w.to(tl.float32) * h.to(x.dtype).to(tl.float32)


@triton.jit
def _rms_norm(x_ptr, res_ptr, w_ptr, out_ptr, stride_x, stride_res, stride_out, eps,
              WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr, ADD_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, WIDTH_PAD)
    mask = cols < WIDTH
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if ADD_RESIDUAL:  # x += residual, in x's dtype, written back: x becomes the new residual stream
        x = (x.to(tl.float32) + tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + row * stride_x + cols, x, mask=mask)
    out = normalise(x, tl.load(w_ptr + cols, mask=mask, other=0.0), eps, WIDTH)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x, weight, eps, residual=None):
    """weight * normalise(x) over the last dim; with residual, x += residual first (in place)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    assert x2.stride(-1) == 1 and (residual is None or x2.data_ptr() == x.data_ptr())
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if x2.shape[0]:
        res = x2 if residual is None else residual.reshape(-1, shape[-1])
        width = shape[-1]
        _rms_norm[(x2.shape[0],)](x2, res, weight, out, x2.stride(0), res.stride(0), out.stride(0), eps,
                                  WIDTH=width, WIDTH_PAD=next_pow2(width), ADD_RESIDUAL=residual is not None,
                                  num_warps=4 if width <= 4096 else 8)
    return out.view(shape)
