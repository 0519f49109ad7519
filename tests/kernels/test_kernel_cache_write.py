"""Cache writes by slot mapping (Triton, under the interpreter): every written slot equals the
reference bit for bit, padding slots (-1) are skipped, and no other slot is touched."""
import pytest
import torch

pytest.importorskip("triton")

import kernels  # noqa: E402
from kernel_helpers import DTYPES, randn  # noqa: E402
from kernels import reference  # noqa: E402
from kernels.cache_write import write_kv  # noqa: E402


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


def test_write_latent_casts_to_the_cache_dtype():
    gen = torch.Generator().manual_seed(0)
    cache = torch.full((4, 16, 576), float("nan"), dtype=torch.bfloat16)
    latent = randn(gen, 9, 576)  # fp32 activations into a bf16 cache
    slot_mapping = slots(gen, 9, 64)
    kernels.write_latent(latent, cache, slot_mapping)
    ref = torch.full_like(cache, float("nan"))
    reference.write_latent(latent, ref, slot_mapping)
    assert torch.equal(cache.nan_to_num(7.0), ref.nan_to_num(7.0))


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
