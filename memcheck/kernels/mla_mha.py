"""MLA prefill in its decompressed (multi-head) form, in Triton: every prefill sequence's context is gathered from the
paged latent cache and decompressed by kv_b_proj into per-head keys and values, then each head attends with its
128-wide nope part plus the 64 rope columns all heads share (192-wide scores), over 128-wide values.

The absorbed form (memcheck/kernels/mla.py) scores against the 576-wide latent and sums 512-wide rows: at DeepSeek-V2's widths
(576 + 512) / (192 + 128) = 3.4x the FLOPs of this form per (query, key) pair. Decode reads every cached token once
for all heads, so it stays absorbed; prefill is compute-bound, so it decompresses first, as vLLM's MLA prefill does:
kv_b_proj costs 2 x 512 x heads x 256 FLOPs per context token, against 2 x 320 x heads per pair attended.
The decompressed keys and values of the whole context live for the call: context tokens x heads x 256 x 2 bytes
(V2-Lite, 16 heads: 8 KiB a token).

One program takes BLOCK_M new tokens of one head and sequence (no padding of rows); the key tiles below the causal
diagonal run unmasked, the diagonal's masked (memcheck/kernels/prefill.py's split_causal), in prefill.py's grid (the last
query tiles first; units side by side in a grid of a few waves).

Context windows: the decompressed keys and values of at most CONTEXT_WINDOW_BYTES are held at a time. A longer context
(all sequences' tokens, packed) is taken window by window, as vLLM's MLA prefill chunks its context: each window's
attention comes out with its log-sum-exp, and the windows are merged.
"""
import torch
import triton
import triton.language as tl

from .dispatch import dot_precision, fix_triton_interpreter, next_pow2, upcast_dots
from .dot import dot, softmax_update
from .prefill import prefill_grid, prefill_hopper, prefill_program

fix_triton_interpreter()

LOG2E = 1.4426950408889634
# 128 query rows on 8 warps, 64-key tiles, 3 stages (a tile's nope, rope and value rows: 40 KiB of shared memory a
# stage): the best worst case of 24 configs on the H200, 2.94x of the FLOP floor; 128-key tiles at 3 stages do not fit.
# hopper: on an sm_90 GPU, memcheck/kernels/prefill_hopper.py (Gluon, warp-specialized) where its shapes allow.
CONFIG = {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "tiles_first": None, "hopper": True}
CPU_CONFIG = {"block_m": 16, "block_n": 16}  # the interpreter runs small tiles faster
# 1 GiB of decompressed keys and values at a time: 128K context tokens of V2-Lite (16 heads x 256 values x 2 bytes), 16K
# of V2 (128 heads)
CONTEXT_WINDOW_BYTES = 1 << 30


@triton.jit
def _rows(ptrs, tok_mask, dims, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr, WHOLE: tl.constexpr):
    """A tile's rows, masked on tokens unless WHOLE (every token of the tile in range) and on padded columns."""
    if WHOLE:
        if WIDTH == WIDTH_PAD:
            return tl.load(ptrs)
        return tl.load(ptrs, mask=(dims < WIDTH)[None, :], other=0.0)
    return tl.load(ptrs, mask=tok_mask[:, None] & (dims < WIDTH)[None, :], other=0.0)


@triton.jit
def _attend(m, l, acc, q_nope, q_pe, k_nope_ptr, k_pe_ptr, v_ptr, head, k_start, start, end, q_pos, qk_scale,
            stride_kn_tok, stride_kn_head, stride_kp_tok, stride_v_tok, stride_v_head,
            NOPE: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
            V_DIM: tl.constexpr, V_PAD: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            WHOLE: tl.constexpr, WINDOWED: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The online softmax (m, l, acc) carried over context tokens [start, end) of one sequence and head. WHOLE:
    end - start is a multiple of BLOCK_N, no token is masked."""
    nope_dims = tl.arange(0, NOPE_PAD)
    rope_dims = tl.arange(0, ROPE_PAD)
    v_dims = tl.arange(0, V_PAD)
    for t0 in range(start, end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        rows = (k_start + toks).to(tl.int64)
        k = _rows(k_nope_ptr + rows[:, None] * stride_kn_tok + head * stride_kn_head + nope_dims[None, :], tok_mask,
                  nope_dims, NOPE, NOPE_PAD, WHOLE)
        k_pe = _rows(k_pe_ptr + rows[:, None] * stride_kp_tok + rope_dims[None, :], tok_mask, rope_dims, ROPE,
                     ROPE_PAD, WHOLE)
        s = dot(q_nope, tl.trans(k), DOT_PRECISION, UPCAST) + dot(q_pe, tl.trans(k_pe), DOT_PRECISION, UPCAST)
        m, l, p, alpha = softmax_update(s, qk_scale, toks, end, q_pos, m, l, not WHOLE, CAUSAL, WINDOWED)
        v = _rows(v_ptr + rows[:, None] * stride_v_tok + head * stride_v_head + v_dims[None, :], tok_mask, v_dims,
                  V_DIM, V_PAD, WHOLE)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
    return m, l, acc


@triton.jit(do_not_specialize=["window_start", "window_end", "tiles_first"])  # one variant for every window
def _mha_prefill(
    q_nope_ptr, q_pe_ptr, k_nope_ptr, k_pe_ptr, v_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, out_ptr, lse_ptr, qk_scale,
    window_start, window_end, tiles_first,
    stride_qn_tok, stride_qn_head, stride_qp_tok, stride_qp_head,
    stride_kn_tok, stride_kn_head, stride_kp_tok, stride_v_tok, stride_v_head,
    stride_o_tok, stride_o_head, stride_lse_tok,
    NOPE: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    V_DIM: tl.constexpr, V_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOWED: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Units: heads (memcheck/kernels/prefill.py's grid). A sequence's new tokens are the last q_len of its k_len context tokens.
    WINDOWED: the keys and values hold the packed context tokens [window_start, window_end) only, each row attends
    over its sequence's tokens there, and writes its log-sum-exp (log2, -inf where it saw none) beside its output."""
    q_tile, head, seq = prefill_program(tiles_first)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if q_tile * BLOCK_M >= q_len:
        return
    k_start = tl.load(cu_seqlens_k_ptr + seq)
    prefix = tl.load(cu_seqlens_k_ptr + seq + 1) - k_start - q_len
    first = 0  # the sequence's first token in the keys held (a window may start past its token 0)
    if WINDOWED:
        first = tl.maximum(window_start - k_start, 0)
        k_start -= window_start  # the row of its token 0 in the keys held (negative where the window starts past it)
    tok = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = tok < q_len
    tok64 = (q_start + tok).to(tl.int64)
    nope_dims = tl.arange(0, NOPE_PAD)
    rope_dims = tl.arange(0, ROPE_PAD)
    v_dims = tl.arange(0, V_PAD)
    q_nope = tl.load(q_nope_ptr + tok64[:, None] * stride_qn_tok + head * stride_qn_head + nope_dims[None, :],
                     mask=row_mask[:, None] & (nope_dims < NOPE)[None, :], other=0.0)
    q_pe = tl.load(q_pe_ptr + tok64[:, None] * stride_qp_tok + head * stride_qp_head + rope_dims[None, :],
                   mask=row_mask[:, None] & (rope_dims < ROPE)[None, :], other=0.0)
    q_pos = prefix + tok
    kv_end = prefix + tl.minimum(q_len, (q_tile + 1) * BLOCK_M)  # the tile's last query sees no further
    masked_from = (prefix + q_tile * BLOCK_M) // BLOCK_N * BLOCK_N  # every row sees the tiles before
    if WINDOWED:
        kv_end = tl.minimum(kv_end, window_end - window_start - k_start)
        masked_from = tl.minimum(tl.maximum(masked_from, first), kv_end)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, V_PAD], tl.float32)
    m, l, acc = _attend(m, l, acc, q_nope, q_pe, k_nope_ptr, k_pe_ptr, v_ptr, head, k_start, first, masked_from,
                        q_pos, qk_scale, stride_kn_tok, stride_kn_head, stride_kp_tok, stride_v_tok, stride_v_head,
                        NOPE, NOPE_PAD, ROPE, ROPE_PAD, V_DIM, V_PAD, BLOCK_N, False, not WINDOWED, WINDOWED,
                        DOT_PRECISION, UPCAST)
    m, l, acc = _attend(m, l, acc, q_nope, q_pe, k_nope_ptr, k_pe_ptr, v_ptr, head, k_start, masked_from, kv_end,
                        q_pos, qk_scale, stride_kn_tok, stride_kn_head, stride_kp_tok, stride_v_tok, stride_v_head,
                        NOPE, NOPE_PAD, ROPE, ROPE_PAD, V_DIM, V_PAD, BLOCK_N, True, False, WINDOWED, DOT_PRECISION,
                        UPCAST)
    if WINDOWED:
        lse = tl.where(l > 0.0, m + tl.log2(l), float("-inf"))
        tl.store(lse_ptr + tok64 * stride_lse_tok + head, lse, mask=row_mask)
    l_safe = tl.where(l == 0.0, 1.0, l)
    tl.store(out_ptr + tok64[:, None] * stride_o_tok + head * stride_o_head + v_dims[None, :],
             (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & (v_dims < V_DIM)[None, :])


# Context tokens a _gather_context program copies, by how many sequences it looks each token up among (a [tokens,
# sequences] comparison): about 8K of it a program.
GATHER_LOOKUPS = 8192
GATHER_COLUMNS = 64  # latent columns a program copies: 9 programs a token block for DeepSeek's 576


@triton.jit(do_not_specialize=["num_seqs", "start", "count", "stride_bt_seq"])
def _gather_context(latent_ptr, block_table_ptr, seq_lens_ptr, out_ptr, cu_k_ptr, num_seqs, start, count,
                    stride_c_slot, stride_bt_seq, stride_o_tok, WIDTH: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    SEQS_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """BLOCK_T packed context tokens (every sequence's tokens 0..seq_len-1, sequence after sequence), from start: each
    found in its sequence and block, its latent row's BLOCK_W columns copied from the paged cache. Program (0, 0) also
    writes the cumulative context lengths."""
    seqs = tl.arange(0, SEQS_PAD)
    lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0).to(tl.int64)
    ends = tl.cumsum(lens, 0)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(cu_k_ptr + 1 + seqs, ends, mask=seqs < num_seqs)
        tl.store(cu_k_ptr + seqs, tl.zeros([SEQS_PAD], tl.int64), mask=seqs == 0)
    i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    held = i < count
    tok = start + i.to(tl.int64)
    seq = tl.sum((ends[None, :] <= tok[:, None]).to(tl.int32), 1)
    pos = tok - tl.sum(tl.where(seqs[None, :] == seq[:, None], ends - lens, 0), 1)
    block = tl.load(block_table_ptr + seq.to(tl.int64) * stride_bt_seq + pos // BLOCK_SIZE, mask=held, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = held[:, None] & (cols < WIDTH)[None, :]
    row = tl.load(latent_ptr + slot[:, None] * stride_c_slot + cols[None, :], mask=mask)
    tl.store(out_ptr + i.to(tl.int64)[:, None] * stride_o_tok + cols[None, :], row, mask=mask)


def gather_context(latent_cache, block_table, seq_lens, start, count):
    """The latent rows of the packed context tokens [start, start + count) (every sequence's tokens 0..seq_len-1,
    sequence after sequence) gathered from the paged cache into [count, width], and the cumulative context lengths
    [S + 1]: one kernel, where ~12 torch ops found the slots and gathered (a 16-head 4K prefill 1.17x faster on an
    H200). No host sync: a CUDA graph can capture it."""
    _, block_size, width = latent_cache.shape
    num_seqs = seq_lens.shape[0]
    rows = latent_cache.new_empty(count, width)
    cu_k = torch.empty(num_seqs + 1, dtype=torch.int64, device=seq_lens.device)
    seqs_pad = max(16, next_pow2(num_seqs))
    block_t = max(16, min(128, GATHER_LOOKUPS // seqs_pad))
    flat = latent_cache.view(-1, width)
    _gather_context[(max(1, triton.cdiv(count, block_t)), triton.cdiv(width, GATHER_COLUMNS))](
        flat, block_table, seq_lens, rows, cu_k, num_seqs, start, count, flat.stride(0), block_table.stride(0),
        rows.stride(0), WIDTH=width, BLOCK_SIZE=block_size, SEQS_PAD=seqs_pad, BLOCK_T=block_t,
        BLOCK_W=GATHER_COLUMNS, num_warps=4)
    return rows, cu_k


def decompress_context(latent_cache, block_table, seq_lens, kv_b_weight, heads, start, count):
    """The packed context tokens [start, start + count): their latent rows gathered from the paged cache, kv_c through
    kv_b_proj: (per-head keys' nope part then values [count, H, nope + v], the shared k_pe [count, rope], cumulative
    context lengths [S + 1])."""
    rank = kv_b_weight.shape[1]
    latent, cu_k = gather_context(latent_cache, block_table, seq_lens, start, count)
    kv = torch.nn.functional.linear(latent[:, :rank], kv_b_weight).view(latent.shape[0], heads, -1)
    return kv, latent[:, rank:], cu_k


def window_tokens(kv_b_weight, latent_cache) -> int:
    """Context tokens a window holds: CONTEXT_WINDOW_BYTES of decompressed keys and values and gathered latent rows."""
    per_token = kv_b_weight.shape[0] * kv_b_weight.element_size() + latent_cache.shape[-1] * latent_cache.element_size()
    return max(1, CONTEXT_WINDOW_BYTES // per_token)


@triton.jit(do_not_specialize=["rows"])  # one variant for every step's count of new tokens
def _merge_window(out_ptr, lse_ptr, part_ptr, part_lse_ptr, dest_ptr, rows, heads, stride_d_tok, stride_d_head,
                  stride_d_dim, V_DIM: tl.constexpr, V_PAD: tl.constexpr, BLOCK_R: tl.constexpr):
    """BLOCK_R (token, head) rows of merge_window, in one pass over out and part."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    held = r < rows
    a = tl.load(lse_ptr + r, mask=held, other=float("-inf"))
    b = tl.load(part_lse_ptr + r, mask=held, other=float("-inf"))
    frame = tl.maximum(a, b)
    frame = tl.where(frame == float("-inf"), 0.0, frame)  # neither saw a key: both weights 0, not NaN
    wa, wb = tl.exp2(a - frame), tl.exp2(b - frame)
    total = wa + wb
    seen = total > 0.0
    wa, wb = tl.where(seen, wa / total, 0.0), tl.where(seen, wb / total, 0.0)
    dims = tl.arange(0, V_PAD)
    mask = held[:, None] & (dims < V_DIM)[None, :]
    at = r[:, None].to(tl.int64) * V_DIM + dims[None, :]
    o = (tl.load(out_ptr + at, mask=mask, other=0.0) * wa[:, None]
         + tl.load(part_ptr + at, mask=mask, other=0.0) * wb[:, None])
    r64 = r.to(tl.int64)
    d_at = ((r64 // heads) * stride_d_tok + (r64 % heads) * stride_d_head)[:, None] + dims[None, :] * stride_d_dim
    tl.store(dest_ptr + d_at, o.to(dest_ptr.dtype.element_ty), mask=mask)
    tl.store(lse_ptr + r, tl.where(seen, frame + tl.log2(total), float("-inf")), mask=held)


def merge_window(out, lse, part, part_lse, dest=None):
    """out, lse <- the attention over what both saw: out and part [T, H, v] float32 (contiguous), each normalised over
    its keys; lse and part_lse [T, H] their log2-sum-exp (-inf: no keys), lse updated in place. The merged output goes
    to dest ([T, H, v], any float dtype and strides; out itself where None). One kernel, not torch's
    elementwise ops: at 128 heads x 32K tokens (three windows) those took 16 of the call's 89 ms on an H200, each of
    their passes over the 2 GiB float32 output."""
    dest = out if dest is None else dest
    assert out.is_contiguous() and part.is_contiguous()  # this module's own buffers
    rows, v_dim = lse.numel(), out.shape[-1]
    block_r = 16 if out.device.type == "cpu" else 32
    _merge_window[(triton.cdiv(rows, block_r),)](out, lse, part, part_lse, dest, rows, out.shape[1], *dest.stride(),
                                                 V_DIM=v_dim, V_PAD=max(16, next_pow2(v_dim)), BLOCK_R=block_r,
                                                 num_warps=4)


def mla_mha_prefill(q_nope, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, kv_b_weight, scale,
                    max_q_len=None, context_tokens=None, *, out=None, config=None, window=None):
    """q_nope [T, H, nope] and q_pe [T, H, rope] (rotated) of every sequence's new tokens, packed by cu_seqlens_q,
    their latent rows already in the cache; kv_b_weight [H * (nope + v), rank] (kv_b_proj). out [T, H, v]: attention
    in value space, ready for o_proj. max_q_len and context_tokens (the sum of seq_lens) are read from the device
    where not given. window: context tokens decompressed at a time (default: window_tokens)."""
    num_tokens, heads, nope = q_nope.shape
    v_dim = kv_b_weight.shape[0] // heads - nope
    assert latent_cache.shape[-1] == kv_b_weight.shape[1] + q_pe.shape[-1], "latent rows are kv_c then k_pe"
    out = q_nope.new_empty(num_tokens, heads, v_dim) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if context_tokens is None:
        context_tokens = int(seq_lens.sum())
    window = window or window_tokens(kv_b_weight, latent_cache)
    cfg = {**CONFIG, **(CPU_CONFIG if q_nope.device.type == "cpu" else {}), **(config or {})}

    def attend(start, count, dest, lse):
        kv, k_pe, cu_k = decompress_context(latent_cache, block_table, seq_lens, kv_b_weight, heads, start, count)
        _launch(q_nope, q_pe, kv, k_pe, cu_seqlens_q, cu_k, dest, lse, scale, start, start + count, max_q_len, cfg)

    if context_tokens <= window:
        attend(0, context_tokens, out, None)
        return out
    merged = torch.empty(num_tokens, heads, v_dim, device=out.device, dtype=torch.float32)
    merged_lse = torch.empty((num_tokens, heads), device=out.device)
    part, part_lse = torch.empty_like(merged), torch.empty_like(merged_lse)
    starts = range(0, context_tokens, window)
    attend(0, window, merged, merged_lse)  # the first window's attention is the merge so far
    for start in starts[1:]:
        attend(start, min(window, context_tokens - start), part, part_lse)
        merge_window(merged, merged_lse, part, part_lse, dest=out if start == starts[-1] else None)
    return out


def _launch(q_nope, q_pe, kv, k_pe, cu_seqlens_q, cu_k, out, lse, scale, window_start, window_end, max_q_len, cfg):
    """_mha_prefill over the keys and values of the packed context tokens [window_start, window_end); with lse (a
    window of a longer context) each row's log-sum-exp is written there too."""
    num_seqs, heads, nope = cu_seqlens_q.shape[0] - 1, q_nope.shape[1], q_nope.shape[2]
    rope, v_dim = q_pe.shape[-1], out.shape[-1]
    if (cfg["hopper"] and prefill_hopper is not None and prefill_hopper.mla_supported(q_nope, q_pe, kv, k_pe, v_dim)
            and cu_seqlens_q.dtype == torch.int32):  # the Gluon kernel's index type (cu_k: int64, read as such)
        grid, tiles_first = prefill_grid(max_q_len, prefill_hopper.BLOCK_M, heads, num_seqs, cfg["tiles_first"],
                                         q_nope.device)
        prefill_hopper.mla_prefill_hopper(q_nope, q_pe, kv, k_pe, cu_seqlens_q, cu_k, scale * LOG2E, grid, tiles_first,
                                          out, lse, (window_start, window_end),
                                          stamps=cfg.get("stamps"))
        return
    k_nope, v = kv[..., :nope], kv[..., nope:]
    grid, tiles_first = prefill_grid(max_q_len, cfg["block_m"], heads, num_seqs, cfg["tiles_first"], q_nope.device)
    _mha_prefill[grid](
        q_nope, q_pe, k_nope, k_pe, v, cu_seqlens_q, cu_k, out, out if lse is None else lse, scale * LOG2E,
        window_start, window_end, tiles_first,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        k_nope.stride(0), k_nope.stride(1), k_pe.stride(0), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), 0 if lse is None else lse.stride(0),
        NOPE=nope, NOPE_PAD=max(16, next_pow2(nope)), ROPE=rope, ROPE_PAD=max(16, next_pow2(rope)),
        V_DIM=v_dim, V_PAD=max(16, next_pow2(v_dim)), BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
        WINDOWED=lse is not None, DOT_PRECISION=dot_precision(q_nope.dtype), UPCAST=upcast_dots(q_nope),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
