"""Write new tokens' K/V (or MLA latent) into the paged cache at their slots, in Triton.

A slot is block_id * block_size + offset (Sequence.slot_mapping, memcheck/stacks/paged/sequence.py); a slot < 0 marks a
padding token and is skipped. One program copies one token's row: all KV heads x head_dim of both
K and V (one launch for the two caches; [num_kv_heads * head_dim] is contiguous in both the input
and the cache), or MLA's 576-wide latent row, which it makes from kv_a_proj_with_mqa's output on the way:
the first kv_lora_rank columns normalised (kv_a_layernorm), the rope columns rotated, and the query's rope
heads rotated too (four launches and a concatenation fewer per layer). From the fused [q | k | v] projection, one program per token also
rotates the query's and the key's heads and writes the key rotated (rotate_and_write_kv: two launches fewer).
"""
import torch
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2
from .norm import normalise
from .rotary import rotate_into

fix_triton_interpreter()


@triton.jit
def _copy_row(src_ptr, dst_ptr, slot, stride_dst_block, stride_dst_slot, cols, mask, BLOCK_SIZE: tl.constexpr):
    row = tl.load(src_ptr + cols, mask=mask)
    dst = dst_ptr + (slot // BLOCK_SIZE) * stride_dst_block + (slot % BLOCK_SIZE) * stride_dst_slot
    tl.store(dst + cols, row.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_latent_rows(
    kv_ptr, norm_w_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr, q_ptr, q_out_ptr, eps,
    stride_kv_tok, stride_cs, stride_c_block, stride_c_slot, stride_q_tok, stride_q_head, stride_qo_tok,
    BLOCK_SIZE: tl.constexpr, RANK: tl.constexpr, RANK_PAD: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr, HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
):
    """One token: its latent row into the cache at its slot (none for a padding token, slot < 0) and, with HEADS,
    its query's rope heads rotated into q_out (padding tokens too: the step reads every row)."""
    tok = tl.program_id(0)
    dt = kv_ptr.dtype.element_ty
    i = tl.arange(0, HALF_PAD)
    pairs = i < HALF
    c = tl.load(cos_ptr + tok * stride_cs + i, mask=pairs, other=0.0)
    s = tl.load(sin_ptr + tok * stride_cs + i, mask=pairs, other=0.0)
    if HEADS > 0:
        heads = tl.arange(0, HEADS_PAD)
        rotate_into(q_ptr + tok.to(tl.int64) * stride_q_tok + heads[:, None] * stride_q_head,
                    q_out_ptr + tok.to(tl.int64) * stride_qo_tok + heads[:, None] * (2 * HALF), i[None, :],
                    (heads < HEADS)[:, None] & pairs[None, :], c[None, :], s[None, :], dt, HALF, INTERLEAVED)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        row = kv_ptr + tok.to(tl.int64) * stride_kv_tok
        dst = cache_ptr + (slot // BLOCK_SIZE) * stride_c_block + (slot % BLOCK_SIZE) * stride_c_slot
        cols = tl.arange(0, RANK_PAD)
        mask = cols < RANK
        latent = normalise(tl.load(row + cols, mask=mask, other=0.0),
                           tl.load(norm_w_ptr + cols, mask=mask, other=0.0), eps, RANK)
        tl.store(dst + cols, latent.to(dt).to(cache_ptr.dtype.element_ty), mask=mask)
        rotate_into(row + RANK, dst + RANK, i, pairs, c, s, dt, HALF, INTERLEAVED)


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


@triton.jit
def _rotate_write_kv_rows(
    qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qkv_tok, stride_cs, stride_q_tok, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
    BLOCK_SIZE: tl.constexpr, HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS: tl.constexpr,
    KV_PAD: tl.constexpr, DIM: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr,
    KV_WIDTH_PAD: tl.constexpr,
):
    """One token: its query heads rotated into q, its key heads rotated and its value heads copied into the
    caches at its slot (none for a padding token, slot < 0)."""
    tok = tl.program_id(0).to(tl.int64)
    row = qkv_ptr + tok * stride_qkv_tok
    dt = qkv_ptr.dtype.element_ty
    i = tl.arange(0, HALF_PAD)
    pairs = i < HALF
    c = tl.load(cos_ptr + tok * stride_cs + i, mask=pairs, other=0.0)[None, :]
    s = tl.load(sin_ptr + tok * stride_cs + i, mask=pairs, other=0.0)[None, :]
    heads = tl.arange(0, HEADS_PAD)
    rotate_into(row + heads[:, None] * DIM, q_ptr + tok * stride_q_tok + heads[:, None] * DIM, i[None, :],
                (heads < HEADS)[:, None] & pairs[None, :], c, s, dt, HALF, INTERLEAVED)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        kv = tl.arange(0, KV_PAD)
        k_dst = k_cache_ptr + (slot // BLOCK_SIZE) * stride_kc_block + (slot % BLOCK_SIZE) * stride_kc_slot
        rotate_into(row + HEADS * DIM + kv[:, None] * DIM, k_dst + kv[:, None] * DIM, i[None, :],
                    (kv < KV_HEADS)[:, None] & pairs[None, :], c, s, dt, HALF, INTERLEAVED)
        cols = tl.arange(0, KV_WIDTH_PAD)
        _copy_row(row + (HEADS + KV_HEADS) * DIM, v_cache_ptr, slot, stride_vc_block, stride_vc_slot, cols,
                  cols < KV_HEADS * DIM, BLOCK_SIZE)


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


def write_latent(kv_a, norm_weight, eps, cos, sin, interleaved, latent_cache, slot_mapping, q_pe=None):
    """kv_a [num_tokens, rank + rope] (kv_a_proj_with_mqa's output, unit stride in a row) -> latent_cache
    [blocks, block_size, rank + rope] at slot_mapping: [kv_a_layernorm(kv_c), rotary(k_pe)]. cos/sin
    [num_tokens, rope / 2] as for kernels.apply_rotary. With q_pe [num_tokens, heads, rope] (the query's rope
    heads, unit stride in a head): returns them rotated, contiguous, in the same launch (as apply_rotary would)."""
    num_tokens, width = kv_a.shape
    half = cos.shape[-1]
    rank = width - 2 * half
    assert kv_a.stride(-1) == 1 and cos.stride() == sin.stride() and latent_cache.shape[-1] == width
    assert latent_cache[0, 0].is_contiguous(), "cache rows must be contiguous"
    heads = 0 if q_pe is None else q_pe.shape[1]
    q_out = None if q_pe is None else torch.empty(num_tokens, heads, 2 * half, dtype=q_pe.dtype, device=q_pe.device)
    if heads:
        assert q_pe.stride(-1) == 1 and q_pe.shape[-1] == 2 * half
    if num_tokens == 0:
        return q_out
    q_args = (q_pe, q_out) if heads else (kv_a, kv_a)
    q_strides = (q_pe.stride(0), q_pe.stride(1), q_out.stride(0)) if heads else (0, 0, 0)
    _write_latent_rows[(num_tokens,)](
        kv_a, norm_weight, cos, sin, latent_cache, slot_mapping, *q_args, eps,
        kv_a.stride(0), cos.stride(0), latent_cache.stride(0), latent_cache.stride(1), *q_strides,
        BLOCK_SIZE=latent_cache.shape[1], RANK=rank, RANK_PAD=next_pow2(rank), HALF=half, HALF_PAD=next_pow2(half),
        INTERLEAVED=interleaved, HEADS=heads, HEADS_PAD=next_pow2(max(heads, 1)), num_warps=4,
        enable_fp_fusion=False)  # the rotary's float32 roundings, as memcheck/kernels/rotary.py
    return q_out


def rotate_and_write_kv(qkv, heads, kv_heads, cos, sin, interleaved, k_cache, v_cache, slot_mapping):
    """qkv [num_tokens, (heads + 2 x kv_heads) x head_dim] (the fused projection's rows, unit stride) -> the
    query rotated [num_tokens, heads, head_dim]; the key rotated and the value into the caches at slot_mapping.
    cos/sin [num_tokens, head_dim / 2] as for kernels.apply_rotary. One launch."""
    tokens = qkv.shape[0]
    dim = k_cache.shape[-1]
    half = cos.shape[-1]
    assert qkv.stride(-1) == 1 and qkv.shape[1] == (heads + 2 * kv_heads) * dim and 2 * half == dim
    assert cos.stride() == sin.stride() and k_cache[0, 0].is_contiguous() and v_cache[0, 0].is_contiguous()
    q = torch.empty(tokens, heads, dim, dtype=qkv.dtype, device=qkv.device)
    if tokens:
        _rotate_write_kv_rows[(tokens,)](
            qkv, cos, sin, q, k_cache, v_cache, slot_mapping,
            qkv.stride(0), cos.stride(0), q.stride(0), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
            v_cache.stride(1), BLOCK_SIZE=k_cache.shape[1], HEADS=heads, HEADS_PAD=next_pow2(heads),
            KV_HEADS=kv_heads, KV_PAD=next_pow2(kv_heads), DIM=dim, HALF=half, HALF_PAD=next_pow2(half),
            INTERLEAVED=interleaved, KV_WIDTH_PAD=next_pow2(kv_heads * dim), num_warps=4,
            enable_fp_fusion=False)  # the rotary's float32 roundings, as memcheck/kernels/rotary.py
    return q
