"""Decode attention over the paged KV cache (one new query token per sequence), in Triton.

A program attends for one KV head at a time, with all the query heads that share it (GQA/MQA/MHA;
the group is padded to 16 rows so both products run on the tensor cores: decode is memory-bound,
the padding costs no bytes). Split-context (flash-decoding), balanced: each KV head's tiles are
split evenly over the programs the GPU holds at once (memcheck/kernels/work_split.py), so one long sequence
fills the GPU as well as many short ones, whatever the mix of lengths; a small second kernel
merges the sequences that a range boundary cut.
"""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .dispatch import (dot_precision, fix_triton_interpreter, launches_early, next_pow2, pdl_options,
                       resident_programs, upcast_dots)
from . import stamps
from .dot import dot, softmax_update
from .stamps import stamp
from .work_split import (RUN_TIME_INTS, line_ranges, locate, merge_partials, program_range, store_range_result,
                         tile_line)

fix_triton_interpreter()

LOG2E = 1.4426950408889634
# Grid size the occupancy probe compiles with: Triton folds an int argument equal to 1 into the
# kernel (a different, smaller kernel), and one divisible by 16 gets other alignment hints.
PROBE_PROGRAMS = 1001
# The sequence lengths are summed over at least this many lanes: at 16, ptxas gives the GPU config 148-149 registers a
# thread (3 programs a multiprocessor), at 32 124-125 (4), and 1-8 sequences from 4K up take 3-8.5% less time. 64 lanes
# cost each launch ~1 us for the wider sum, so only the time stamps' build takes them (155 registers at 32, 126-128 at 64).
SEQS_PAD_LEAST = 32
SEQS_PAD_LEAST_STAMPED = 64
# Tuned on the H200: tokens per loop step, warps, pipeline depth (2 stages: b256 x 4K 1.05x of the floor, 1.18x at 3),
# register cap; min_tiles: tiles per range at least (memcheck/kernels/work_split.py).
DEFAULT_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 2, "maxnreg": None, "min_tiles": 1}


@triton.jit
def attend_tokens(q, k_ptr, v_ptr, bt_row, kv_head, start, end, qk_scale,
                   stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok, stride_v_head, q_pos,
                   ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax of q's ROWS rows over tokens [start, end) of one KV head: (max, sum, unnormalized out).
    CAUSAL: row r sees tokens up to q_pos[r] only (prefill, memcheck/kernels/prefill.py); decode passes q_pos unused."""
    return attend_more_tokens(tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32),
                              tl.zeros([ROWS, HEAD_DIM_PAD], tl.float32), q, k_ptr, v_ptr, bt_row, kv_head, start,
                              end, qk_scale, stride_k_block, stride_k_tok, stride_k_head, stride_v_block,
                              stride_v_tok, stride_v_head, q_pos, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, CAUSAL,
                              DOT_PRECISION, UPCAST)


@triton.jit
def attend_more_tokens(m, l, acc, q, k_ptr, v_ptr, bt_row, kv_head, start, end, qk_scale,
                       stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok, stride_v_head, q_pos,
                       HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """attend_tokens, carried on from an online softmax's state (m, l, acc) of earlier tokens: a prefill runs its
    tiles below the causal diagonal unmasked, then the diagonal's tiles masked, into one state."""
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    for t0 in range(start, end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        blocks = tl.load(bt_row + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
        slot_in_block = toks % BLOCK_SIZE
        kv_mask = tok_mask[:, None] & dim_mask[None, :]
        k_rows = blocks * stride_k_block + slot_in_block * stride_k_tok + kv_head * stride_k_head
        k = tl.load(k_ptr + k_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), DOT_PRECISION, UPCAST)
        m, l, p, alpha = softmax_update(s, qk_scale, toks, end, q_pos, m, l, True, CAUSAL)
        v_rows = blocks * stride_v_block + slot_in_block * stride_v_tok + kv_head * stride_v_head
        v = tl.load(v_ptr + v_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
    return m, l, acc


@triton.jit(do_not_specialize=RUN_TIME_INTS)
def _decode(
    q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, stamps_ptr,
    qk_scale, num_seqs, num_programs,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr, MIN_TILES: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr, STAMPS: tl.constexpr,
):
    """Range j of KV head `kv_head`'s tile line (memcheck/kernels/work_split.py). STAMPS: memcheck/kernels/stamps.py's diagnostic."""
    pid = tl.program_id(0)
    if STAMPS:
        stamp(stamps_ptr, pid, 0)
    if PDL:  # launched early (dispatch.launches_early): everything read here may come from the kernel before
        gdc_wait()
    if STAMPS:
        stamp(stamps_ptr, pid, 1)
    kv_head = pid % NUM_KV_HEADS
    seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, SEQS_PAD)
    first, last = program_range(pid // NUM_KV_HEADS,
                                line_ranges(num_programs, NUM_KV_HEADS, total, MIN_TILES, tiles, False, 0), total)
    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    out_mask = row_mask[:, None] & (dims < HEAD_DIM)[None, :]
    if STAMPS:
        stamp(stamps_ptr, pid, 2)
    x = first
    while x < last:
        seq, t_first, n, seq_len, seq_end = locate(x, seqs, lens, tiles, ends)
        seg_end = tl.minimum(last, seq_end)
        t_last = t_first + seg_end - x
        heads = kv_head * GROUP + rows
        q = tl.load(q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                    mask=out_mask, other=0.0)
        m, l, acc = attend_tokens(q, k_ptr, v_ptr, block_table_ptr + seq * stride_bt_seq, kv_head,
                                  t_first * BLOCK_N, tl.minimum(t_last * BLOCK_N, seq_len), qk_scale,
                                  stride_k_block, stride_k_tok, stride_k_head,
                                  stride_v_block, stride_v_tok, stride_v_head, 0,
                                  GROUP_PAD, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, False, DOT_PRECISION, UPCAST)
        store_range_result(acc, m, l, out_ptr, seq, stride_o_seq, stride_o_head, heads, dims, out_mask, row_mask,
                           rows, part_out_ptr, part_lse_ptr, pid, (t_first == 0) & (t_last == n), x, first, GROUP,
                           HEAD_DIM)
        x = seg_end
    if STAMPS:
        stamp(stamps_ptr, pid, 3)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale, *, out=None, config=None, num_programs=None):
    """Triton paged decode. out: a buffer to write (tests poison it); config (block_n, num_warps,
    num_stages, maxnreg, min_tiles; stamps: memcheck/kernels/stamps.py) and num_programs override the tuned defaults and the
    one-wave grid."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    on_gpu = q.device.type == "cuda"
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    block_n = cfg["block_n"] if on_gpu else 16  # the interpreter runs small tiles faster
    stamp_buf = stamps.buffer(cfg)
    seqs_pad = max(SEQS_PAD_LEAST if stamp_buf is None else SEQS_PAD_LEAST_STAMPED, next_pow2(num_seqs))
    consts = dict(NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=max(16, next_pow2(group)),
                  HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
                  BLOCK_SIZE=block_size, BLOCK_N=block_n, SEQS_PAD=seqs_pad,
                  MIN_TILES=cfg["min_tiles"], DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(k_cache),
                  STAMPS=stamp_buf is not None, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                  **pdl_options(launches_early(q.device)))
    if on_gpu and cfg.get("maxnreg"):  # cap registers to fit more programs per multiprocessor
        consts["maxnreg"] = cfg["maxnreg"]

    def args(programs, part_out, part_lse):
        return (q, k_cache, v_cache, block_table, seq_lens, out, part_out, part_lse,
                part_lse if stamp_buf is None else stamp_buf, scale * LOG2E, num_seqs, programs,
                q.stride(0), q.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                block_table.stride(0), out.stride(0), out.stride(1))

    if num_programs is None:
        scratch = torch.empty(16, device=q.device)

        def probe():
            return _decode.warmup(*args(PROBE_PROGRAMS, scratch, scratch), grid=(1,), **consts)

        num_programs = resident_programs(_decode, (tuple(consts.items()), q.dtype, k_cache.dtype), q.device,
                                         cfg["num_warps"], probe)
    num_programs = num_kv_heads * max(1, num_programs // num_kv_heads)  # whole ranges for every KV head
    assert stamp_buf is None or stamp_buf.numel() >= num_programs * stamps.SLOTS
    part_out = torch.empty(num_programs * 2 * group * head_dim, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(num_programs * 2 * group, device=q.device, dtype=torch.float32)
    _decode[(num_programs,)](*args(num_programs, part_out, part_lse), **consts)
    merge_partials(part_out, part_lse, seq_lens, out, num_programs, num_heads=num_q_heads, units=num_kv_heads,
                   rows=group, head_dim=head_dim, block_n=block_n, min_tiles=cfg["min_tiles"])
    return out
