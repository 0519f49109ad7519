"""Write new tokens' K/V (or MLA latent) into the paged cache at their slots, in Triton.

A slot is block_id * block_size + offset (kernels.Sequence.slot_mapping); a slot < 0 marks a
padding token and is skipped. One program copies one token's row: all KV heads x head_dim for
K/V ([num_kv_heads * head_dim] is contiguous in both the input and the cache), or the 576-wide
latent for MLA.
"""
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2

fix_triton_interpreter()


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
    mask = cols < WIDTH
    row = tl.load(src_ptr + tok * stride_src_tok + cols, mask=mask)
    dst = dst_ptr + (slot // BLOCK_SIZE) * stride_dst_block + (slot % BLOCK_SIZE) * stride_dst_slot
    tl.store(dst + cols, row.to(dst_ptr.dtype.element_ty), mask=mask)


def _write(src, cache, slot_mapping) -> None:
    """src [num_tokens, *row] -> cache [num_blocks, block_size, *row] at slot_mapping."""
    num_tokens = src.shape[0]
    if num_tokens == 0:
        return
    src = src.reshape(num_tokens, -1)
    if src.stride(-1) != 1:
        src = src.contiguous()
    if src.device.type == "cpu" and src.dtype != cache.dtype:
        src = src.to(cache.dtype)  # the interpreter truncates fp32 -> bf16; the GPU rounds to nearest even
    width = src.shape[1]
    assert cache[0, 0].numel() == width and cache[0, 0].is_contiguous(), "cache rows must be contiguous"
    _write_rows[(num_tokens,)](
        src, cache, slot_mapping,
        src.stride(0), cache.stride(0), cache.stride(1),
        BLOCK_SIZE=cache.shape[1], WIDTH=width, WIDTH_PAD=next_pow2(width),
        num_warps=4 if width <= 2048 else 8,
    )


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """key/value [num_tokens, num_kv_heads, head_dim] -> k_cache/v_cache at slot_mapping."""
    _write(key, k_cache, slot_mapping)
    _write(value, v_cache, slot_mapping)


def write_latent(latent, latent_cache, slot_mapping) -> None:
    """latent [num_tokens, kv_lora_rank + qk_rope_head_dim] -> latent_cache at slot_mapping."""
    _write(latent, latent_cache, slot_mapping)
