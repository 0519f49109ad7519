"""The one-launch elementwise kernels (Triton, under the interpreter) against the torch reference the CPU
runs: RMSNorm with and without the residual add, rotary (neox and interleaved), silu(gate) * up."""
import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DTYPES, assert_close, randn  # noqa: E402
from memcheck.kernels import activation, norm, reference, rotary  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    gen = torch.Generator().manual_seed(3)
    dt = DTYPES[dtype]
    x, weight = randn(gen, 5, 72, dtype=dt) * 3, randn(gen, 72, dtype=dt)
    residual = randn(gen, 5, 72, dtype=dt) if with_residual else None
    x_ref = x.clone()
    ref = reference.rms_norm(x_ref, weight, 1e-6, residual)
    out = norm.rms_norm(x, weight, 1e-6, residual)
    assert out.dtype == ref.dtype
    assert_close(out, ref)
    assert_close(x, x_ref)  # the residual add is written back to x, as the reference's x += residual


def test_rms_norm_reads_strided_rows():
    """MLA normalises the latent half of the kv_a projection's rows in place of a copy."""
    gen = torch.Generator().manual_seed(4)
    rows, weight = randn(gen, 6, 40), randn(gen, 32)
    assert_close(norm.rms_norm(rows[:, :32], weight, 1e-6), reference.rms_norm(rows[:, :32], weight, 1e-6))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary(dtype, interleaved):
    gen = torch.Generator().manual_seed(5)
    dt = DTYPES[dtype]
    qkv = randn(gen, 7, 3 * 4 * 16, dtype=dt)
    x = qkv[:, :4 * 16].view(7, 4, 16)  # a strided view of fused projection rows, as the model passes
    angles = randn(gen, 7, 8) * 3
    cos, sin = angles.cos(), angles.sin()
    if not interleaved:
        cos, sin = cos.to(dt), sin.to(dt)
    out = rotary.rotary(x, cos, sin, interleaved)
    ref = reference.rotary(x, cos, sin, interleaved)
    assert out.is_contiguous() and out.dtype == dt
    assert_close(out, ref)  # (bit-exact on the GPU in bf16; the interpreter truncates where the GPU rounds)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_silu_mul_in_place(dtype):
    gen = torch.Generator().manual_seed(6)
    dt = DTYPES[dtype]
    gate_up = randn(gen, 3, 2 * 1100, dtype=dt) * 4  # inter 1100: two column tiles, the second masked
    ref = reference.silu_mul_(gate_up.clone())
    out = activation.silu_mul_(gate_up)
    assert out.data_ptr() == gate_up.data_ptr() and out.shape == (3, 1100)
    assert_close(out, ref)
