"""Multi-head latent attention (DeepSeek-V2/V3) over the paged latent cache, in Triton: decode, and
prefill (chunked too) of every sequence in one launch.

Absorbed form: the caller folds W_UK into the query (q_latent = q_nope @ W_UK, kv_lora_rank wide),
so every head attends straight over the cached latent: scores = q_latent.kv_c + q_pe.k_pe, and the
output stays in latent space (softmax @ kv_c, kv_lora_rank wide) for the caller's W_UV. The cache
has one shared 576-wide row per token (kv_c 512 then k_pe 64), read once for all the heads of a
program: a block of HEAD_BLOCK heads, so the products run on the tensor cores. The work is split
as in paged decode (memcheck/kernels/work_split.py), head blocks taking the place of KV heads. Prefill rows are
(new token, head) pairs of one sequence, causal among the new tokens, full view of the cached prefix;
the latent is read once per tile of rows, never gathered or decompressed into per-head K/V.
"""
import torch
import triton
import triton.language as tl

from .dispatch import dot_precision, fix_triton_interpreter, next_pow2, resident_programs, upcast_dots
from . import stamps
from .dot import dot, softmax_update
from .prefill import prefill_grid, prefill_program, prefill_rows
from .work_split import (RUN_TIME_INTS, line_ranges, locate, merge_partials, program_range, store_range_result,
                         tile_line)

try:  # the Hopper kernels are Gluon (triton.experimental.gluon, Triton 3.5 on): without it, _mla_decode everywhere
    from . import mla_narrow, mla_seesaw
except ImportError:
    mla_narrow = mla_seesaw = None

fix_triton_interpreter()

LOG2E = 1.4426950408889634
# Grid size the occupancy probe compiles with: Triton folds an int argument equal to 1 into the
# kernel (a different, smaller kernel), and one divisible by 16 gets other alignment hints.
PROBE_PROGRAMS = 1001
# Tuned on the H200; maxnreg 168 fits 3 programs per multiprocessor, not 2. min_tiles: tiles per range at least
# (memcheck/kernels/work_split.py), a partial weighing as much as a tile: 2 the fastest for V2-Lite's 8 x 550 tokens.
DEFAULT_CONFIG = {"block_n": 32, "num_warps": 4, "num_stages": 2, "head_block": 16, "maxnreg": 168, "min_tiles": 2,
                  "split_tail": False}
# 17 to 32 heads (V2/V3 over 4 tensor-parallel ranks) where the seesaw does not run: 32-head blocks run the products on
# wider tensor-core tiles (128 heads x 4K, batch 32: 5.39x of the FLOP floor against 16-head blocks' 7.02x).
MID_HEADS_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 2, "head_block": 32, "maxnreg": None, "min_tiles": 2,
                    "split_tail": False}
# More than 32 heads (V2/V3's 128, compute-bound on the H200): 64-head blocks on two warpgroups, wgmma with no spills in
# the loop (the 32-head blocks' loop spills). split_tail: a sequence's whole tiles unmasked, in a loop of their own
# (_mla_tokens), this kernel being bound by issuing instructions: 0.91x the time at the median. hopper: on an sm_90 GPU,
# the seesaw (memcheck/kernels/mla_seesaw.py) in place of _mla_decode, same tiles and split: b256 x 4K at 1.44x of the
# floor; its partials bf16, as FlashInfer's split-KV decode keeps its own (relative error 0.0024 where sequences are cut
# in ranges, 0.0018 in float32; bound 0.01).
MANY_HEADS_CONFIG = {"block_n": 64, "num_warps": 8, "num_stages": 2, "head_block": 64, "maxnreg": None, "min_tiles": 2,
                     "split_tail": True, "hopper": True}
# 17 to 32 heads where the seesaw runs (an sm_90 GPU): one 64-head block, the rows past the last head masked (4x/2x the
# products, still under the latent's bytes) and partials of its heads' rows only. Against _mla_decode's 32-head
# blocks: 1.38-1.58x faster. mla_narrow (the heads as N) is slower here: a 151 MB layer 1.80x of the copy floor
# against the seesaw's 1.48x on the H200, each tile read by two warpgroups.
# Up to 16 heads (V2-Lite; V2/V3 over 8 ranks) where it runs: mla_narrow.py, the heads as the products' N, the same
# tiles, ranges and partials (the same workspace) as the seesaw, whose tiles it falls back to elsewhere. On the H200:
# 151 MB 1.42x against the seesaw's 1.49x, 302 MB 1.19x against 1.24x, 38 MB 2.17x against 2.46x (0-9% faster on an
# H100 too). min_tiles 1: its partial (16 heads x 512, bf16: 16 KiB) is a quarter of the 72 KiB tile it summarises, so
# a small layer is cut into one-tile ranges, half the latency chain a program (H100, L2 flushed: 8 x 550 tokens
# 14.3 -> 11.1 us a layer, 1 x 1K 11.8 -> 10.4; docs/kernel-decisions.md); larger layers are cut as before.
FEW_HEADS_HOPPER_CONFIG = {**MANY_HEADS_CONFIG, "narrow": True, "min_tiles": 1}
NARROW_MOST_HEADS = 16
# 17 to 64 heads where the seesaw runs: one-tile ranges on a line of at most 3/4 of the programs ("short_line", a
# percent), two-tile ranges beyond. Its bf16 partial (32 and 64 KiB) is about the 72 KiB tile it summarises: on a short
# line a chain less a program pays, on a longer one the partials' traffic costs more (H100, L2 flushed, us a layer, 64
# heads, min_tiles 1 / 2: 16 tiles 13.3 / 14.0, 64 14.6 / 15.1, 72 15.1 / 17.1, 96 16.2 / 16.0, 128 18.2 / 17.0, 192
# 20.6 / 19.4; 32 heads, 128 tiles 15.3 / 15.5, 192 18.1 / 17.5). Above 64 heads (128 KiB at 128): min_tiles 2.
MID_HEADS_HOPPER_CONFIG = {**MANY_HEADS_CONFIG, "min_tiles": 2, "short_line": 75}
ONE_TILE_RANGES_MOST_HEADS = 64
# Prefill: rows = new tokens x heads per program (32: two tokens of a 16-head block, a [32, 512] float32
# accumulator): a 4K prompt at 16 heads at 14.0x of the floor.
PREFILL_CONFIG = {"rows": 32, "block_n": 64, "num_warps": 4, "num_stages": 2}
CPU_PREFILL_TILES = {"rows": 16, "block_n": 16}  # the interpreter runs small tiles faster


@triton.jit
def _latent_columns(rows, toks, end, FIRST: tl.constexpr, WIDTH: tl.constexpr, PAD: tl.constexpr,
                    MASK_END: tl.constexpr):
    """Columns FIRST..FIRST+WIDTH of the latent rows, padded to PAD with zeros; MASK_END: tokens >= end read as zeros.
    No mask at all where neither applies."""
    dims = tl.arange(0, PAD)
    if MASK_END:
        return tl.load(rows[:, None] + FIRST + dims[None, :], mask=(toks < end)[:, None] & (dims < WIDTH)[None, :],
                       other=0.0)
    if WIDTH != PAD:
        return tl.load(rows[:, None] + FIRST + dims[None, :], mask=(dims < WIDTH)[None, :], other=0.0)
    return tl.load(rows[:, None] + FIRST + dims[None, :])


@triton.jit
def _mla_tile(q_lat, q_pe, cache_ptr, bt_row, t0, end, qk_scale, stride_c_block, stride_c_tok, q_pos, m, l, acc,
              RANK: tl.constexpr, RANK_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
              BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASK_END: tl.constexpr, CAUSAL: tl.constexpr,
              DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The online softmax carried over the BLOCK_N latent tokens from t0. MASK_END: the tile may run past `end`
    (loads and scores masked); without it nothing is masked but the pads of RANK and ROPE and, CAUSAL, each row's
    future (a sequence's whole tiles: in the SASS of 128-head decode, 1458 -> 1227 instructions a tile)."""
    toks = t0 + tl.arange(0, BLOCK_N)
    if MASK_END:
        blocks = tl.load(bt_row + toks // BLOCK_SIZE, mask=toks < end, other=0).to(tl.int64)
    else:
        blocks = tl.load(bt_row + toks // BLOCK_SIZE).to(tl.int64)
    rows = cache_ptr + blocks * stride_c_block + (toks % BLOCK_SIZE) * stride_c_tok
    kv_c = _latent_columns(rows, toks, end, 0, RANK, RANK_PAD, MASK_END)
    k_pe = _latent_columns(rows, toks, end, RANK, ROPE, ROPE_PAD, MASK_END)
    s = dot(q_lat, tl.trans(kv_c), DOT_PRECISION, UPCAST) + dot(q_pe, tl.trans(k_pe), DOT_PRECISION, UPCAST)
    m, l, p, alpha = softmax_update(s, qk_scale, toks, end, q_pos, m, l, MASK_END, CAUSAL)
    return m, l, acc * alpha[:, None] + dot(p.to(kv_c.dtype), kv_c, DOT_PRECISION, UPCAST)


@triton.jit
def _mla_tokens(q_lat, q_pe, cache_ptr, bt_row, start, end, qk_scale, stride_c_block, stride_c_tok, q_pos,
                ROWS: tl.constexpr, RANK: tl.constexpr, RANK_PAD: tl.constexpr,
                ROPE: tl.constexpr, ROPE_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SPLIT_TAIL: tl.constexpr,
                DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax of ROWS query rows over latent tokens [start, end): (max, sum, unnormalized out). CAUSAL: row r
    sees tokens up to q_pos[r] only (prefill); decode passes q_pos unused. SPLIT_TAIL: the tiles wholly before `end`
    in a loop of their own, unmasked, then the one that runs past it, if any; else every tile masked, in one loop (a
    second loop's pipeline costs more than the masks save where the work is not bound by issuing instructions:
    16-head decode)."""
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, RANK_PAD], tl.float32)
    tail = start
    if SPLIT_TAIL:
        tail = start + (end - start) // BLOCK_N * BLOCK_N
        for t0 in range(start, tail, BLOCK_N):
            m, l, acc = _mla_tile(q_lat, q_pe, cache_ptr, bt_row, t0, end, qk_scale, stride_c_block, stride_c_tok,
                                  q_pos, m, l, acc, RANK, RANK_PAD, ROPE, ROPE_PAD, BLOCK_SIZE, BLOCK_N, False, CAUSAL,
                                  DOT_PRECISION, UPCAST)
    for t0 in range(tail, end, BLOCK_N):
        m, l, acc = _mla_tile(q_lat, q_pe, cache_ptr, bt_row, t0, end, qk_scale, stride_c_block, stride_c_tok, q_pos,
                              m, l, acc, RANK, RANK_PAD, ROPE, ROPE_PAD, BLOCK_SIZE, BLOCK_N, True, CAUSAL,
                              DOT_PRECISION, UPCAST)
    return m, l, acc


@triton.jit(do_not_specialize=RUN_TIME_INTS)
def _mla_decode(
    q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, num_seqs, num_programs,
    stride_ql_seq, stride_ql_head, stride_qp_seq, stride_qp_head,
    stride_c_block, stride_c_tok,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    NUM_HEADS: tl.constexpr, HEAD_BLOCK: tl.constexpr, NUM_HEAD_BLOCKS: tl.constexpr,
    RANK: tl.constexpr, RANK_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr, MIN_TILES: tl.constexpr,
    SPLIT_TAIL: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Range j of head block `head_block`'s tile line (memcheck/kernels/work_split.py)."""
    pid = tl.program_id(0)
    head_block = pid % NUM_HEAD_BLOCKS
    seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, SEQS_PAD)
    ranges = line_ranges(num_programs, NUM_HEAD_BLOCKS, total, MIN_TILES, tiles, True, 0)
    first, last = program_range(pid // NUM_HEAD_BLOCKS, ranges, total)
    rows = tl.arange(0, HEAD_BLOCK)
    rank_dims = tl.arange(0, RANK_PAD)
    rank_mask = rank_dims < RANK
    rope_dims = tl.arange(0, ROPE_PAD)
    x = first
    while x < last:
        seq, t_first, n, seq_len, seq_end = locate(x, seqs, lens, tiles, ends)
        seg_end = tl.minimum(last, seq_end)
        t_last = t_first + seg_end - x
        heads = head_block * HEAD_BLOCK + rows
        head_mask = heads < NUM_HEADS
        out_mask = head_mask[:, None] & rank_mask[None, :]
        q_lat = tl.load(q_latent_ptr + seq * stride_ql_seq + heads[:, None] * stride_ql_head + rank_dims[None, :],
                        mask=out_mask, other=0.0)
        q_pe = tl.load(q_pe_ptr + seq * stride_qp_seq + heads[:, None] * stride_qp_head + rope_dims[None, :],
                       mask=head_mask[:, None] & (rope_dims < ROPE)[None, :], other=0.0)
        m, l, acc = _mla_tokens(q_lat, q_pe, cache_ptr, block_table_ptr + seq * stride_bt_seq,
                                t_first * BLOCK_N, tl.minimum(t_last * BLOCK_N, seq_len), qk_scale,
                                stride_c_block, stride_c_tok, 0, HEAD_BLOCK, RANK, RANK_PAD, ROPE, ROPE_PAD,
                                BLOCK_SIZE, BLOCK_N, False, SPLIT_TAIL, DOT_PRECISION, UPCAST)
        store_range_result(acc, m, l, out_ptr, seq, stride_o_seq, stride_o_head, heads, rank_dims, out_mask,
                           head_mask, rows, part_out_ptr, part_lse_ptr, pid, (t_first == 0) & (t_last == n), x, first,
                           HEAD_BLOCK, RANK)
        x = seg_end



@triton.jit(do_not_specialize=["stride_bt_seq"])  # (see work_split.RUN_TIME_INTS)
def _mla_prefill(
    q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr, out_ptr,
    qk_scale,
    stride_ql_tok, stride_ql_head, stride_qp_tok, stride_qp_head,
    stride_c_block, stride_c_tok,
    stride_bt_seq,
    stride_o_tok, stride_o_head,
    NUM_HEADS: tl.constexpr, HEAD_BLOCK: tl.constexpr, BLOCK_Q: tl.constexpr,
    RANK: tl.constexpr, RANK_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """BLOCK_Q new tokens of one sequence times HEAD_BLOCK heads: one latent tile serves all the rows."""
    q_tile, head_block, seq = prefill_program(1)
    q_start, q_len, prefix, tok, in_block = prefill_rows(cu_seqlens_q_ptr, seq_lens_ptr, q_tile, seq, BLOCK_Q,
                                                         HEAD_BLOCK)
    if q_tile * BLOCK_Q >= q_len:
        return
    heads = head_block * HEAD_BLOCK + in_block
    row_mask = (tok < q_len) & (heads < NUM_HEADS)
    rank_dims = tl.arange(0, RANK_PAD)
    rope_dims = tl.arange(0, ROPE_PAD)
    out_mask = row_mask[:, None] & (rank_dims < RANK)[None, :]
    tok64 = (q_start + tok).to(tl.int64)
    q_lat = tl.load(q_latent_ptr + tok64[:, None] * stride_ql_tok + heads[:, None] * stride_ql_head
                    + rank_dims[None, :], mask=out_mask, other=0.0)
    q_pe = tl.load(q_pe_ptr + tok64[:, None] * stride_qp_tok + heads[:, None] * stride_qp_head + rope_dims[None, :],
                   mask=row_mask[:, None] & (rope_dims < ROPE)[None, :], other=0.0)
    kv_end = prefix + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)  # the tile's last token sees no further
    m, l, acc = _mla_tokens(q_lat, q_pe, cache_ptr, block_table_ptr + seq * stride_bt_seq, 0, kv_end, qk_scale,
                            stride_c_block, stride_c_tok, prefix + tok, BLOCK_Q * HEAD_BLOCK, RANK, RANK_PAD,
                            ROPE, ROPE_PAD, BLOCK_SIZE, BLOCK_N, True, True, DOT_PRECISION, UPCAST)
    l = tl.where(l == 0.0, 1.0, l)
    tl.store(out_ptr + tok64[:, None] * stride_o_tok + heads[:, None] * stride_o_head + rank_dims[None, :],
             (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


def mla_prefill(q_latent, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, scale, max_q_len=None, *,
                out=None, config=None):
    """Triton MLA prefill: q_latent [T, H, R] and q_pe [T, H, P] of every sequence's new tokens, packed
    (sequence i owns rows cu_seqlens_q[i]:cu_seqlens_q[i+1]), their latent rows already in the cache.
    out [T, H, R] in latent space. config (rows, block_n, num_warps, num_stages) overrides PREFILL_CONFIG."""
    num_tokens, num_heads, rank = q_latent.shape
    rope = q_pe.shape[-1]
    _, block_size, width = latent_cache.shape
    assert width == rank + rope, f"latent cache rows are {width} wide, queries {rank} + {rope}"
    assert q_latent.stride(-1) == 1 and q_pe.stride(-1) == 1 and latent_cache.stride(-1) == 1
    out = torch.empty_like(q_latent) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    on_gpu = q_latent.device.type == "cuda"
    cfg = {**PREFILL_CONFIG, **({} if on_gpu else CPU_PREFILL_TILES), **(config or {})}
    # 16 rows: the tensor cores' least; the interpreter takes any power of two
    head_block = 16 if on_gpu else min(16, next_pow2(num_heads))
    block_q = max(1, cfg["rows"] // head_block)
    grid, _ = prefill_grid(max_q_len, block_q, triton.cdiv(num_heads, head_block), num_seqs, True, q_latent.device)
    _mla_prefill[grid](
        q_latent, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, out,
        scale * LOG2E,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0),
        out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, HEAD_BLOCK=head_block, BLOCK_Q=block_q,
        RANK=rank, RANK_PAD=max(16, next_pow2(rank)), ROPE=rope, ROPE_PAD=max(16, next_pow2(rope)),
        BLOCK_SIZE=block_size, BLOCK_N=cfg["block_n"],
        DOT_PRECISION=dot_precision(q_latent.dtype), UPCAST=upcast_dots(latent_cache),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def decode_config(num_heads: int, hopper: bool = False) -> dict:
    """The tuned decode config for this many heads (per tensor-parallel rank); hopper: where the Gluon kernels run."""
    if hopper and num_heads <= ONE_TILE_RANGES_MOST_HEADS:
        return FEW_HEADS_HOPPER_CONFIG if num_heads <= NARROW_MOST_HEADS else MID_HEADS_HOPPER_CONFIG
    if num_heads > 32:
        return MANY_HEADS_CONFIG
    return DEFAULT_CONFIG if num_heads <= 16 else MID_HEADS_CONFIG


def _hopper_takes(cfg, q_latent, q_pe, latent_cache, num_heads) -> bool:
    """Whether the Gluon seesaw (memcheck/kernels/mla_seesaw.py) runs this call: asked for (config hopper), its tiles, a
    GPU and shapes it runs."""
    return (mla_seesaw is not None and cfg.get("hopper", False)
            and (cfg["head_block"], cfg["block_n"]) == (mla_seesaw.HEAD_BLOCK, mla_seesaw.BLOCK_N)
            and mla_seesaw.supported(q_latent, q_pe, latent_cache, num_heads))


def mla_decode(q_latent, q_pe, latent_cache, block_table, seq_lens, scale, *, out=None, config=None,
               num_programs=None):
    """MLA decode: Triton's _mla_decode, or the Gluon seesaw (memcheck/kernels/mla_seesaw.py) on Hopper. out: a buffer
    to write (tests poison it); config (block_n, num_warps, num_stages, head_block, maxnreg, min_tiles, split_tail,
    hopper: the seesaw where it runs; short_line: the seesaw's one-tile ranges on a line of at most this percent of
    the programs; narrow: mla_narrow.py where it runs, 32 heads or fewer; trigger: narrow's PDL trigger after each
    program's last tile request) and num_programs override the tuned defaults (decode_config) and the grid."""
    num_seqs, num_heads, rank = q_latent.shape
    rope = q_pe.shape[-1]
    _, block_size, width = latent_cache.shape
    assert width == rank + rope, f"latent cache rows are {width} wide, queries {rank} + {rope}"
    assert q_latent.stride(-1) == 1 and q_pe.stride(-1) == 1 and latent_cache.stride(-1) == 1
    hopper = mla_seesaw is not None and mla_seesaw.supported(q_latent, q_pe, latent_cache, num_heads)
    cfg = {**decode_config(num_heads, hopper), **(config or {})}
    on_gpu = q_latent.device.type == "cuda"
    out = torch.empty_like(q_latent) if out is None else out
    if num_seqs == 0:
        return out
    if cfg.get("narrow") and mla_narrow is not None and mla_narrow.supported(q_latent, q_pe, latent_cache, num_heads):
        return mla_narrow.mla_decode_narrow(q_latent, q_pe, latent_cache, block_table, seq_lens, scale * LOG2E,
                                            out, min_tiles=cfg["min_tiles"], num_programs=num_programs,
                                            stamps=stamps.buffer(cfg), trigger=cfg.get("trigger", False))
    if _hopper_takes(cfg, q_latent, q_pe, latent_cache, num_heads):
        return mla_seesaw.mla_decode_seesaw(q_latent, q_pe, latent_cache, block_table, seq_lens, scale * LOG2E,
                                            out, min_tiles=cfg["min_tiles"], short_line=cfg.get("short_line", 0),
                                            num_programs=num_programs, stamps=stamps.buffer(cfg))
    if stamps.buffer(cfg) is not None:
        raise ValueError("config stamps: only the Gluon decode kernels (sm_90, hopper) write time stamps, not "
                         "_mla_decode")
    head_block = min(cfg["head_block"], max(16, next_pow2(num_heads)))
    num_head_blocks = triton.cdiv(num_heads, head_block)
    block_n = cfg["block_n"] if on_gpu else 16  # the interpreter runs small tiles faster
    consts = dict(NUM_HEADS=num_heads, HEAD_BLOCK=head_block, NUM_HEAD_BLOCKS=num_head_blocks,
                  RANK=rank, RANK_PAD=max(16, next_pow2(rank)), ROPE=rope, ROPE_PAD=max(16, next_pow2(rope)),
                  BLOCK_SIZE=block_size, BLOCK_N=block_n, SEQS_PAD=max(16, next_pow2(num_seqs)),
                  MIN_TILES=cfg["min_tiles"], SPLIT_TAIL=cfg["split_tail"],
                  DOT_PRECISION=dot_precision(q_latent.dtype), UPCAST=upcast_dots(latent_cache),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if on_gpu and cfg.get("maxnreg"):
        consts["maxnreg"] = cfg["maxnreg"]

    def args(programs, part_out, part_lse):
        return (q_latent, q_pe, latent_cache, block_table, seq_lens, out, part_out, part_lse,
                scale * LOG2E, num_seqs, programs,
                q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
                latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0),
                out.stride(0), out.stride(1))

    if num_programs is None:
        scratch = torch.empty(16, device=q_latent.device)

        def probe():
            return _mla_decode.warmup(*args(PROBE_PROGRAMS, scratch, scratch), grid=(1,), **consts)

        key = (tuple(consts.items()), q_latent.dtype, latent_cache.dtype)
        num_programs = resident_programs(_mla_decode, key, q_latent.device, cfg["num_warps"], probe)
    num_programs = num_head_blocks * max(1, num_programs // num_head_blocks)  # whole ranges per head block
    part_out = torch.empty(num_programs * 2 * head_block * rank, device=q_latent.device, dtype=torch.float32)
    part_lse = torch.empty(num_programs * 2 * head_block, device=q_latent.device, dtype=torch.float32)
    _mla_decode[(num_programs,)](*args(num_programs, part_out, part_lse), **consts)
    merge_partials(part_out, part_lse, seq_lens, out, num_programs, num_heads=num_heads, units=num_head_blocks,
                   rows=head_block, head_dim=rank, block_n=block_n, min_tiles=cfg["min_tiles"], align=True)
    return out
