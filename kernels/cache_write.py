"""Write new tokens' K/V (or MLA latent) into the paged cache at their slots, in Triton.

A slot is block_id * block_size + offset (Sequence.slot_mapping, harness/stacks/paged/sequence.py); a slot < 0 marks a
padding token and is skipped. One program copies one token's row: all KV heads x head_dim of both
K and V (one launch for the two caches; [num_kv_heads * head_dim] is contiguous in both the input
and the cache), or the 576-wide latent for MLA.
"""
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2

fix_triton_interpreter()


@triton.jit
def _copy_row(src_ptr, dst_ptr, slot, stride_dst_block, stride_dst_slot, cols, mask, BLOCK_SIZE: tl.constexpr):
    row = tl.load(src_ptr + cols, mask=mask)
    dst = dst_ptr + (slot // BLOCK_SIZE) * stride_dst_block + (slot % BLOCK_SIZE) * stride_dst_slot
    tl.store(dst + cols, row.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_rows(
    src_ptr, dst_ptr, slot_ptr,
    stride_src_tok, stride_dst_block, stride_dst_slot,
    BLOCK_SIZE: tl.constexpr, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    cols = tl.arange(0, WIDTH_PAD)
    _copy_row(src_ptr + tok * stride_src_tok, dst_ptr, slot, stride_dst_block, stride_dst_slot, cols, cols < WIDTH,
              BLOCK_SIZE)


@triton.jit
def _write_kv_rows(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_k_tok, stride_v_tok, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
    BLOCK_SIZE: tl.constexpr, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    cols = tl.arange(0, WIDTH_PAD)
    mask = cols < WIDTH
    _copy_row(k_ptr + tok * stride_k_tok, k_cache_ptr, slot, stride_kc_block, stride_kc_slot, cols, mask, BLOCK_SIZE)
    _copy_row(v_ptr + tok * stride_v_tok, v_cache_ptr, slot, stride_vc_block, stride_vc_slot, cols, mask, BLOCK_SIZE)


def _rows(src, cache):
    """src [num_tokens, *row] as [num_tokens, width] rows with unit stride, in the cache dtype on the CPU."""
    src = src.reshape(src.shape[0], -1)
    if src.stride(-1) != 1:
        src = src.contiguous()
    if src.device.type == "cpu" and src.dtype != cache.dtype:
        src = src.to(cache.dtype)  # the interpreter truncates fp32 -> bf16; the GPU rounds to nearest even
    assert cache[0, 0].numel() == src.shape[1] and cache[0, 0].is_contiguous(), "cache rows must be contiguous"
    return src


def _warps(width: int) -> int:
    return 4 if width <= 2048 else 8


def _write(src, cache, slot_mapping) -> None:
    """src [num_tokens, *row] -> cache [num_blocks, block_size, *row] at slot_mapping."""
    num_tokens = src.shape[0]
    if num_tokens == 0:
        return
    src = _rows(src, cache)
    width = src.shape[1]
    _write_rows[(num_tokens,)](
        src, cache, slot_mapping,
        src.stride(0), cache.stride(0), cache.stride(1),
        BLOCK_SIZE=cache.shape[1], WIDTH=width, WIDTH_PAD=next_pow2(width), num_warps=_warps(width),
    )


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """key/value [num_tokens, num_kv_heads, head_dim] -> k_cache/v_cache at slot_mapping, one launch."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    key, value = _rows(key, k_cache), _rows(value, v_cache)
    width = key.shape[1]
    _write_kv_rows[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), value.stride(0), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        BLOCK_SIZE=k_cache.shape[1], WIDTH=width, WIDTH_PAD=next_pow2(width), num_warps=_warps(width),
    )


def write_latent(latent, latent_cache, slot_mapping) -> None:
    """latent [num_tokens, kv_lora_rank + qk_rope_head_dim] -> latent_cache at slot_mapping."""
    _write(latent, latent_cache, slot_mapping)
