"""Cache writes by slot mapping (Triton, under the interpreter): every written slot equals the
reference bit for bit, padding slots (-1) are skipped, and no other slot is touched."""
import pytest
import torch

pytest.importorskip("triton")

from memcheck import kernels  # noqa: E402
from kernel_helpers import DTYPES, randn  # noqa: E402
from memcheck.kernels import reference  # noqa: E402
from memcheck.kernels.cache_write import write_kv  # noqa: E402


def slots(gen, num_tokens, num_slots):
    s = torch.randperm(num_slots, generator=gen)[:num_tokens]
    s[::4] = -1  # padding tokens
    return s


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_write_kv(block_size, dtype):
    gen = torch.Generator().manual_seed(block_size)
    dt = DTYPES[dtype]
    k_cache = torch.full((5, block_size, 2, 16), float("nan"), dtype=dt)
    v_cache = k_cache.clone()
    key, value = randn(gen, 11, 2, 16, dtype=dt), randn(gen, 11, 2, 16, dtype=dt)
    slot_mapping = slots(gen, 11, 5 * block_size)
    write_kv(key, value, k_cache, v_cache, slot_mapping)
    k_ref, v_ref = torch.full_like(k_cache, float("nan")), torch.full_like(v_cache, float("nan"))
    reference.write_kv(key, value, k_ref, v_ref, slot_mapping)
    assert torch.equal(k_cache.nan_to_num(123.0), k_ref.nan_to_num(123.0))
    assert torch.equal(v_cache.nan_to_num(123.0), v_ref.nan_to_num(123.0))
    written = slot_mapping[slot_mapping >= 0]
    assert k_cache.flatten(0, 1).isnan().all(-1).all(-1).sum() == 5 * block_size - len(written)


def latent_case(gen, tokens, rank, rope, dtype, cache_dtype, block_size=16, blocks=4):
    """kv_a_proj's output as a view into a wider projection (as the fused q + kv_a product leaves it)."""
    wide = randn(gen, tokens, 24 + rank + rope, dtype=dtype)
    kv_a = wide[:, 24:]
    angles = torch.rand(tokens, rope // 2, generator=gen) * 6.3
    norm_w = (torch.rand(rank, generator=gen) + 0.5).to(dtype)
    cache = torch.full((blocks, block_size, rank + rope), float("nan"), dtype=cache_dtype)
    return kv_a, norm_w, angles.cos(), angles.sin(), cache, slots(gen, tokens, blocks * block_size)


@pytest.mark.parametrize("interleaved", [True, False])
def test_write_latent_normalises_and_rotates_into_the_slots(interleaved):
    """float32: every written slot holds the reference's [rms_norm(kv_c), rotary(k_pe)]: the rotated part bit
    for bit, the normalised part to float32 rounding (its sum of squares adds in another order)."""
    gen = torch.Generator().manual_seed(int(interleaved))
    kv_a, norm_w, cos, sin, cache, slot_mapping = latent_case(gen, 9, 48, 16, torch.float32, torch.float32)
    kernels.write_latent(kv_a, norm_w, 1e-6, cos, sin, interleaved, cache, slot_mapping)
    ref = torch.full_like(cache, float("nan"))
    reference.write_latent(kv_a, norm_w, 1e-6, cos, sin, interleaved, ref, slot_mapping)
    assert torch.equal(cache[..., 48:].nan_to_num(7.0), ref[..., 48:].nan_to_num(7.0))
    assert torch.allclose(cache[..., :48].nan_to_num(7.0), ref[..., :48].nan_to_num(7.0), rtol=1e-6, atol=1e-6)
    written = slot_mapping[slot_mapping >= 0]
    assert cache.flatten(0, 1).isnan().all(-1).sum() == cache.shape[0] * cache.shape[1] - len(written)


def test_write_latent_bf16_deepseek_widths():
    """Within two bf16 roundings (the interpreter truncates where the GPU rounds to nearest even)."""
    gen = torch.Generator().manual_seed(5)
    kv_a, norm_w, cos, sin, cache, slot_mapping = latent_case(gen, 7, 512, 64, torch.bfloat16, torch.bfloat16)
    kernels.write_latent(kv_a, norm_w, 1e-6, cos, sin, True, cache, slot_mapping)
    ref = torch.full_like(cache, float("nan"))
    reference.write_latent(kv_a, norm_w, 1e-6, cos, sin, True, ref, slot_mapping)
    assert torch.equal(cache.isnan(), ref.isnan())
    assert torch.allclose(cache.float().nan_to_num(7.0), ref.float().nan_to_num(7.0), rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("interleaved", [True, False])
def test_write_latent_rotates_the_querys_rope_heads_too(interleaved):
    """q_pe, the rope part of each query head (a strided view of the projection, as the MLA layer passes it):
    returned rotated bit for bit as kernels.apply_rotary's reference, padding tokens (slot -1) included; the
    cache rows as without it."""
    gen = torch.Generator().manual_seed(11 + int(interleaved))
    kv_a, norm_w, cos, sin, cache, slot_mapping = latent_case(gen, 9, 48, 16, torch.float32, torch.float32)
    slot_mapping[3] = -1
    q = randn(gen, 9, 5, 24 + 16, dtype=torch.float32)
    q_pe = q[..., 24:]
    alone = cache.clone()
    kernels.write_latent(kv_a, norm_w, 1e-6, cos, sin, interleaved, alone, slot_mapping)
    rotated = kernels.write_latent(kv_a, norm_w, 1e-6, cos, sin, interleaved, cache, slot_mapping, q_pe=q_pe)
    assert rotated.shape == (9, 5, 16) and rotated.is_contiguous()
    assert torch.equal(rotated, reference.rotary(q_pe, cos, sin, interleaved))
    assert torch.equal(cache.nan_to_num(7.0), alone.nan_to_num(7.0))
    assert reference.write_latent(kv_a, norm_w, 1e-6, cos, sin, interleaved, alone, slot_mapping) is None


def test_keys_split_from_a_fused_qkv_projection():
    """K/V as views into a wider qkv tensor (token stride larger than a row) are read correctly."""
    gen = torch.Generator().manual_seed(1)
    qkv = randn(gen, 6, 8 + 2 + 2, 16)
    key, value = qkv[:, 8:10], qkv[:, 10:12]
    k_cache, v_cache = torch.zeros(3, 8, 2, 16), torch.zeros(3, 8, 2, 16)
    slot_mapping = torch.tensor([0, 9, 17, 3, -1, 23])
    write_kv(key, value, k_cache, v_cache, slot_mapping)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    reference.write_kv(key, value, k_ref, v_ref, slot_mapping)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rotate_and_write_kv_from_the_fused_projection(interleaved, dtype):
    """One launch against the reference's rotary, rotary, write_kv: the query rotated and the key rotated into
    the cache bit for bit in float32 (within the interpreter's bf16 truncation otherwise), the value copied,
    padding tokens' query rotated but nothing of theirs written. GQA 6 / 2 heads of 16, rows with a wider
    stride (a projection with bias columns past them: a view)."""
    gen = torch.Generator().manual_seed(2 + interleaved)
    dt = DTYPES[dtype]
    heads, kv_heads, dim, tokens = 6, 2, 16, 9
    wide = randn(gen, tokens, (heads + 2 * kv_heads) * dim + 8, dtype=dt)
    qkv = wide[:, :(heads + 2 * kv_heads) * dim]
    angles = torch.rand(tokens, dim // 2, generator=gen) * 6.3
    cos, sin = angles.cos(), angles.sin()
    if not interleaved:
        cos, sin = cos.to(dt), sin.to(dt)  # neox rotates in the model dtype (Rotary.cos_sin)
    k_cache = torch.full((4, 8, kv_heads, dim), float("nan"), dtype=dt)
    v_cache = k_cache.clone()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slot_mapping = slots(gen, tokens, 32)
    q = kernels.rotate_and_write_kv(qkv, heads, kv_heads, cos, sin, interleaved, k_cache, v_cache, slot_mapping)
    q_ref = reference.rotate_and_write_kv(qkv, heads, kv_heads, cos, sin, interleaved, k_ref, v_ref, slot_mapping)
    assert q.shape == (tokens, heads, dim) and q.dtype == dt
    assert torch.equal(k_cache.isnan(), k_ref.isnan()) and torch.equal(v_cache.nan_to_num(3.0), v_ref.nan_to_num(3.0))
    if dt == torch.float32:
        assert torch.equal(q, q_ref) and torch.equal(k_cache.nan_to_num(3.0), k_ref.nan_to_num(3.0))
    else:
        assert torch.allclose(q.float(), q_ref.float(), rtol=2e-2, atol=2e-2)
        assert torch.allclose(k_cache.float().nan_to_num(3.0), k_ref.float().nan_to_num(3.0), rtol=2e-2, atol=2e-2)
    written = slot_mapping[slot_mapping >= 0]
    assert k_cache.flatten(0, 1).isnan().all(-1).all(-1).sum() == 32 - len(written)
