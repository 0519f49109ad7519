"""Decode attention over the paged KV cache (one new query token per sequence), in Triton.

One program reads one KV head of one sequence over one partition of its context, for all the
query heads that share that KV head (GQA/MQA/MHA: the group is padded to 16 rows so the two
products run on the tensor cores; decode is memory-bound, the padding costs no bytes).
Split-context (flash-decoding): when sequences x KV heads are too few to fill the GPU, the
context is cut into partitions whose partial results (normalized output + log-sum-exp) a
second, small kernel combines. With one partition the first kernel writes the output directly.
"""

import torch
import triton
import triton.language as tl

from .dispatch import dot_precision, fix_triton_interpreter, next_pow2, resident_programs, sm_count, upcast_dots
from .dot import dot
from .work_split import combine_cut_units, locate, program_range, tile_line

fix_triton_interpreter()

LOG2E = 1.4426950408889634

# Tuned on the H200 (benchmarks/kernels_h200.py): tokens per loop step, warps, pipeline depth.
DEFAULT_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 3}
PROGRAMS_PER_SM = 4  # aim for at least this many programs per multiprocessor
MIN_PARTITION = 512  # tokens; shorter partitions spend more on partials than they win


@triton.jit
def _attend_tokens(q, k_ptr, v_ptr, bt_row, kv_head, start, end, qk_scale,
                   stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok, stride_v_head,
                   GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Online softmax of q's rows over tokens [start, end) of one KV head: (max, sum, unnormalized out)."""
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for t0 in range(start, end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        blocks = tl.load(bt_row + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
        slot_in_block = toks % BLOCK_SIZE
        kv_mask = tok_mask[:, None] & dim_mask[None, :]
        k_rows = blocks * stride_k_block + slot_in_block * stride_k_tok + kv_head * stride_k_head
        k = tl.load(k_ptr + k_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), DOT_PRECISION, UPCAST) * qk_scale  # log2 units
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v_rows = blocks * stride_v_block + slot_in_block * stride_v_tok + kv_head * stride_v_head
        v = tl.load(v_ptr + v_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
        m = m_new
    return m, l, acc


@triton.jit
def _decode_partition(
    q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, partition_size,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    stride_po_seq, stride_po_head, stride_po_split,
    stride_pl_seq, stride_pl_head,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    ONE_SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    # KV head varies fastest, so programs running side by side read neighbouring rows of a block.
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * partition_size
    if not ONE_SPLIT:
        if start >= seq_len:
            return
    end = tl.minimum(start + partition_size, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)

    m, l, acc = _attend_tokens(q, k_ptr, v_ptr, block_table_ptr + seq * stride_bt_seq, kv_head, start, end, qk_scale,
                               stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok, stride_v_head,
                               GROUP_PAD, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, UPCAST)

    out_mask = row_mask[:, None] & dim_mask[None, :]
    if ONE_SPLIT:
        l = tl.where(l == 0.0, 1.0, l)  # empty sequence: output zeros
        o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
        tl.store(o_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        po_ptrs = (part_out_ptr + seq * stride_po_seq + heads[:, None] * stride_po_head
                   + split * stride_po_split + dims[None, :])
        tl.store(po_ptrs, acc / l[:, None], mask=out_mask)
        tl.store(part_lse_ptr + seq * stride_pl_seq + heads * stride_pl_head + split,
                 m + tl.log2(l), mask=row_mask)


@triton.jit
def _combine_partitions(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, partition_size,
    stride_po_seq, stride_po_head, stride_po_split,
    stride_pl_seq, stride_pl_head,
    stride_o_seq, stride_o_head,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """out = sum_i w_i o_i / sum_i w_i with w_i = 2^(lse_i - max lse), over the partitions used."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_splits = tl.cdiv(tl.load(seq_lens_ptr + seq), partition_size)
    splits = tl.arange(0, SPLITS_PAD)
    split_mask = splits < num_splits
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    lse = tl.load(part_lse_ptr + seq * stride_pl_seq + head * stride_pl_head + splits,
                  mask=split_mask, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp2(lse - lse_max)
    o = tl.load(part_out_ptr + seq * stride_po_seq + head * stride_po_head
                + splits[:, None] * stride_po_split + dims[None, :],
                mask=split_mask[:, None] & dim_mask[None, :], other=0.0)
    total = tl.sum(w, 0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(w[:, None] * o, 0) / total
    tl.store(out_ptr + seq * stride_o_seq + head * stride_o_head + dims, out.to(out_ptr.dtype.element_ty),
             mask=dim_mask)


@triton.jit
def _decode_balanced(
    q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, num_seqs, num_programs,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """One program of a one-wave grid: its even share of the tile line (see kernels/work_split.py)."""
    pid = tl.program_id(0)
    seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, NUM_KV_HEADS, SEQS_PAD)
    first, last = program_range(pid, num_programs, total)
    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    out_mask = row_mask[:, None] & dim_mask[None, :]
    x = first
    while x < last:
        seq, kv_head, t_first, n, seq_len, unit_end = locate(x, seqs, lens, tiles, ends, NUM_KV_HEADS)
        seg_end = tl.minimum(last, unit_end)
        t_last = t_first + seg_end - x
        heads = kv_head * GROUP + rows
        q = tl.load(q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                    mask=out_mask, other=0.0)
        m, l, acc = _attend_tokens(q, k_ptr, v_ptr, block_table_ptr + seq * stride_bt_seq, kv_head,
                                   t_first * BLOCK_N, tl.minimum(t_last * BLOCK_N, seq_len), qk_scale,
                                   stride_k_block, stride_k_tok, stride_k_head,
                                   stride_v_block, stride_v_tok, stride_v_head,
                                   GROUP_PAD, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, UPCAST)
        if (t_first == 0) & (t_last == n):  # the whole unit: final output
            o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
            tl.store(o_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
        else:  # cut: slot 0 if it is this program's first unit, 1 if its last (both if both)
            part = acc / l[:, None]
            lse = m + tl.log2(l)
            for slot in tl.static_range(2):
                if ((slot == 0) & (x == first)) | ((slot == 1) & (seg_end == last)):
                    at = (pid * 2 + slot) * GROUP + rows
                    tl.store(part_out_ptr + at[:, None] * HEAD_DIM + dims[None, :], part, mask=out_mask)
                    tl.store(part_lse_ptr + at, lse, mask=row_mask)
        x = seg_end


def plan_partition(num_seqs: int, num_kv_heads: int, max_len: int, sms: int, block_n: int) -> int:
    """Tokens per partition: enough partitions that programs fill every multiprocessor
    PROGRAMS_PER_SM times over, none shorter than MIN_PARTITION. max_len when one will do."""
    base = max(1, num_seqs * num_kv_heads)
    splits = min(-(-PROGRAMS_PER_SM * sms // base), max(1, max_len // MIN_PARTITION))
    if splits <= 1:
        return max_len
    return -(-max_len // (splits * block_n)) * block_n


def combine_partitions(part_out, part_lse, seq_lens, out, partition_size: int) -> None:
    num_seqs, num_heads, num_splits, head_dim = part_out.shape
    _combine_partitions[(num_seqs, num_heads)](
        part_out, part_lse, seq_lens, out, partition_size,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), SPLITS_PAD=max(2, next_pow2(num_splits)),
        num_warps=4,
    )


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale, *, out=None, split="balanced",
                 partition_size=None, config=None, num_programs=None):
    """Triton paged decode. out: a buffer to write (tests poison it). split: "balanced" (even
    tile ranges over a one-wave grid) or "grid" (fixed partitions); the rest override the planners
    (for tuning)."""
    if split == "grid":
        return _paged_decode_grid(q, k_cache, v_cache, block_table, seq_lens, scale, out, partition_size, config)
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    if q.device.type == "cpu":  # the interpreter: small tiles run faster
        cfg["block_n"] = 16
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    consts = dict(NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=max(16, next_pow2(group)),
                  HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
                  BLOCK_SIZE=block_size, BLOCK_N=cfg["block_n"], SEQS_PAD=max(16, next_pow2(num_seqs)))
    launch = dict(DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(k_cache),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg.get("maxnreg"):  # cap registers to fit more programs per multiprocessor
        launch["maxnreg"] = cfg["maxnreg"]

    def args(grid_size, part_out, part_lse):
        return (q, k_cache, v_cache, block_table, seq_lens, out, part_out, part_lse,
                scale * LOG2E, num_seqs, grid_size,
                q.stride(0), q.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                block_table.stride(0), out.stride(0), out.stride(1))

    if num_programs is None:
        num_programs = resident_programs(
            _decode_balanced, (tuple(consts.items()), tuple(launch.items()), q.dtype, k_cache.dtype), q.device,
            cfg["num_warps"], lambda: _decode_balanced.warmup(*args(1, *[torch.empty(16, device=q.device)] * 2), grid=(1,),
                                                    **consts, **launch))
    part_out = torch.empty(num_programs * 2 * group * head_dim, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(num_programs * 2 * group, device=q.device, dtype=torch.float32)
    _decode_balanced[(num_programs,)](*args(num_programs, part_out, part_lse), **consts, **launch)
    combine_cut_units[(num_seqs, num_q_heads)](
        part_out, part_lse, seq_lens, out, num_seqs, num_programs, out.stride(0), out.stride(1),
        UNITS=num_kv_heads, ROWS=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=consts["HEAD_DIM_PAD"],
        BLOCK_N=cfg["block_n"], SEQS_PAD=consts["SEQS_PAD"], num_warps=1,
    )
    return out


def _paged_decode_grid(q, k_cache, v_cache, block_table, seq_lens, scale, out, partition_size, config):
    """Grid of (KV head, partition, sequence) programs, partitions combined by a second kernel."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    if q.device.type == "cpu":  # the interpreter: small tiles run faster
        cfg["block_n"] = 16
    group = num_q_heads // num_kv_heads
    max_len = block_table.shape[1] * block_size  # an upper bound known without a device sync
    if partition_size is None:
        partition_size = plan_partition(num_seqs, num_kv_heads, max_len, sm_count(q.device), cfg["block_n"])
    num_splits = max(1, -(-max_len // partition_size))
    one_split = num_splits == 1

    out = torch.empty_like(q) if out is None else out
    if one_split:
        part_out = part_lse = out  # unused
        po_strides, pl_strides = (0, 0, 0), (0, 0)
    else:
        part_out = torch.empty(num_seqs, num_q_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(num_seqs, num_q_heads, num_splits, device=q.device, dtype=torch.float32)
        po_strides, pl_strides = part_out.stride()[:3], part_lse.stride()[:2]

    _decode_partition[(num_kv_heads, num_splits, num_seqs)](
        q, k_cache, v_cache, block_table, seq_lens, out, part_out, part_lse,
        scale * LOG2E, partition_size,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        out.stride(0), out.stride(1),
        *po_strides, *pl_strides,
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_N=cfg["block_n"],
        ONE_SPLIT=one_split, DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(k_cache),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if not one_split:
        combine_partitions(part_out, part_lse, seq_lens, out, partition_size)
    return out
