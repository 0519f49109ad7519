"""Dense paged decode on Hopper (sm_90), in Gluon: several key and value tiles in flight a program.

kernels/decode.py's Triton kernel holds one tile in flight a program: Triton's pipeliner issues the next tile's
copies after this tile's products (their addresses come from the block table, a load in the loop) and waits on them
at the top of the next step, whatever num_stages (the sm_90 TTGIR: one buffer, `async_wait num = 0`). It reaches the
bandwidth only with three programs a multiprocessor and long ranges; one sequence's ranges are 5 tiles, and a third
of the time is each program's ramp (ncu: 2.6 TB/s at GQA 28/4 x 32K; kernels_h200_2026-12-02_notes.md).
Here one program a multiprocessor keeps a ring of STAGES key and value tiles: the block numbers a tile ahead of its
copy, the first STAGES tiles as one copy, and tile i + STAGES issued as soon as tile i's products are done, so
STAGES - 1 tiles land under every tile's products. The query heads sharing a KV head (GQA/MHA) are the rows of a
64-row wgmma block, the rows past the group zero and never stored: decode is memory-bound, the padding costs no bytes.
Same tile line, ranges and partials as _decode (kernels/work_split.py), merged by its combine_cut_units.
Triton's interpreter cannot run Gluon: the answers are checked on the GPU by benchmarks/decode_hopper_h200.py.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .dispatch import next_pow2, on_hopper, sm_count
from .mla_hopper import _program_range, _segment, _tile_blocks, _tile_landed
from .work_split import RUN_TIME_INTS, merge_partials

ROWS, TILE, NUM_WARPS = 64, 64, 4  # query rows (a wgmma block), keys a tile, one warpgroup
# Tiles in the ring: 4 x 32 KiB of keys and values, the query and P: 152 KiB at head_dim 128, one program a
# multiprocessor.
STAGES = 4


def supported(q, k_cache, v_cache) -> bool:
    """This kernel's shapes: a Hopper GPU, bf16, head_dim 64 or 128, at most 64 query heads a KV head, rows that
    cp.async copies 16 bytes at a time."""
    num_q_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    rows = (q, k_cache, v_cache)
    return (on_hopper(q.device) and q.dtype == k_cache.dtype == v_cache.dtype == torch.bfloat16
            and head_dim in (64, 128) and num_q_heads % kv_heads == 0 and num_q_heads // kv_heads <= ROWS
            and all(t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1]) for t in rows))


@gluon.jit
def _load_kv(k_s, v_s, k_ptr, v_ptr, blocks, t0, end, toks, cols, kv_head, stride_k_block, stride_k_tok,
             stride_k_head, stride_v_block, stride_v_tok, stride_v_head, BLOCK_SIZE: gl.constexpr):
    """Gather tokens t0.. of a sequence (one KV head's rows) into a key and a value tile; rows past `end` zero."""
    tok = t0 + toks
    valid = (tok < end)[:, None]
    slot = tok % BLOCK_SIZE
    k_rows = k_ptr + blocks * stride_k_block + slot * stride_k_tok + kv_head * stride_k_head
    v_rows = v_ptr + blocks * stride_v_block + slot * stride_v_tok + kv_head * stride_v_head
    cp.async_copy_global_to_shared(k_s, k_rows[:, None] + cols[None, :], mask=valid)
    cp.async_copy_global_to_shared(v_s, v_rows[:, None] + cols[None, :], mask=valid)


@gluon.jit
def _store_group(o, m, l, rows_o: gl.constexpr, whole, x, first, seq, kv_head, o_rows, o_cols, out_ptr,
                 part_out_ptr, part_lse_ptr, stride_o_seq, stride_o_head, GROUP: gl.constexpr,
                 HEAD_DIM: gl.constexpr):
    """The group's rows of a segment's output: the answer if the segment is the whole sequence, else a float32
    partial and its log-sum-exp in slot 0 (the range's first sequence) or 1 (its last): work_split's layout."""
    held = o_rows < GROUP
    if whole:
        heads = kv_head * GROUP + o_rows
        o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + o_cols[None, :]
        gl.store(o_ptrs, o.to(gl.bfloat16), mask=held[:, None])
    else:
        at = (gl.program_id(0) * 2 + (x != first).to(gl.int32)) * GROUP + o_rows
        gl.store(part_out_ptr + at[:, None] * HEAD_DIM + o_cols[None, :], o, mask=held[:, None])
        gl.store(part_lse_ptr + at, gl.convert_layout(m, rows_o) + gl.log2(l), mask=held)


@gluon.jit(do_not_specialize=RUN_TIME_INTS)
def _decode_hopper(
    q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, num_seqs, num_programs,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    NUM_KV_HEADS: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_SIZE: gl.constexpr,
    SEQS_PAD: gl.constexpr, MIN_TILES: gl.constexpr, STAGES: gl.constexpr,
):
    """Range j of KV head `pid % NUM_KV_HEADS`'s tile line, as _decode."""
    ROWS: gl.constexpr = 64
    TILE: gl.constexpr = 64
    line: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte copies
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, TILE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS, HEAD_DIM], smem)
    # the rings as one [STAGES x TILE, HEAD_DIM] buffer each: the first STAGES tiles land in one copy, and tile i in
    # rows (i % STAGES) x TILE, a static slice (the loop steps STAGES tiles at a time)
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * TILE, HEAD_DIM], smem)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * TILE, HEAD_DIM], smem)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS, TILE], smem)

    kv_head, first, last, seqs, lens, tiles, ends = _program_range(seq_lens_ptr, num_seqs, num_programs,
                                                                   NUM_KV_HEADS, MIN_TILES, TILE, SEQS_PAD, line)
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, ld))
    q_rows = (rows < GROUP)[:, None]  # the rows past the group: zeros, never stored
    toks = gl.arange(0, TILE, gl.SliceLayout(1, ld))
    ring_toks = gl.arange(0, STAGES * TILE, gl.SliceLayout(1, ld))
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, ld))
    o_rows = gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    s_cols = gl.arange(0, TILE, gl.SliceLayout(0, s_layout))

    x = first
    while x < last:
        seq, n, t_first, count, seg_end, start, end = _segment(x, last, seqs, lens, tiles, ends, TILE)
        bt_row = block_table_ptr + seq * stride_bt_seq

        cp.async_copy_global_to_shared(q_s, q_ptr + seq * stride_q_seq + (kv_head * GROUP + rows)[:, None]
                                       * stride_q_head + cols[None, :], mask=q_rows)
        _load_kv(k_ring, v_ring, k_ptr, v_ptr, _tile_blocks(bt_row, start, end, ring_toks, BLOCK_SIZE), start, end,
                 ring_toks, cols, kv_head, stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok,
                 stride_v_head, BLOCK_SIZE)
        cp.commit_group()
        for _ in gl.static_range(STAGES - 1):
            cp.commit_group()  # one group a tile, empty or not: wait_group(STAGES - 1) is then always this tile's
        blocks_next = _tile_blocks(bt_row, start + STAGES * TILE, end, toks, BLOCK_SIZE)

        m = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_acc = gl.zeros([ROWS, TILE], gl.float32, s_layout)  # row sums, reduced once at the end
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
        for i0 in range(0, count, STAGES):
            for stage in gl.static_range(STAGES):
                i = i0 + stage
                if i < count:
                    k_tile = k_ring.slice(stage * TILE, TILE)
                    v_tile = v_ring.slice(stage * TILE, TILE)
                    cp.wait_group(STAGES - 1)
                    _tile_landed()
                    s = warpgroup_mma(q_s, k_tile.permute((1, 0)), gl.zeros([ROWS, TILE], gl.float32, s_layout),
                                      is_async=True)
                    s = warpgroup_mma_wait(0, deps=[s])
                    valid = (start + i * TILE + s_cols) < end
                    s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
                    m_new = gl.maximum(m, gl.max(s, axis=1))
                    alpha = gl.exp2(m - m_new)
                    p = gl.exp2(s - m_new[:, None])
                    l_acc = l_acc * alpha[:, None] + p
                    m = m_new
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    p_s.store(p.to(gl.bfloat16))
                    fence_async_shared()
                    gl.thread_barrier()
                    acc = warpgroup_mma_wait(0, deps=[warpgroup_mma(p_s, v_tile, acc, is_async=True)])
                    gl.thread_barrier()  # the tile's buffers and P are free
                    if i + STAGES < count:
                        _load_kv(k_tile, v_tile, k_ptr, v_ptr, blocks_next, start + (i + STAGES) * TILE, end, toks,
                                 cols, kv_head, stride_k_block, stride_k_tok, stride_k_head, stride_v_block,
                                 stride_v_tok, stride_v_head, BLOCK_SIZE)
                    cp.commit_group()
                    blocks_next = _tile_blocks(bt_row, start + (i + STAGES + 1) * TILE, end, toks, BLOCK_SIZE)

        l_out = gl.convert_layout(gl.sum(l_acc, axis=1), gl.SliceLayout(1, o_layout))
        _store_group(acc / l_out[:, None], m, l_out, gl.SliceLayout(1, o_layout), (t_first == 0) & (count == n), x,
                     first, seq, kv_head, o_rows, o_cols, out_ptr, part_out_ptr, part_lse_ptr, stride_o_seq,
                     stride_o_head, GROUP, HEAD_DIM)
        x = seg_end


def paged_decode_hopper(q, k_cache, v_cache, block_table, seq_lens, qk_scale, out, *, min_tiles, num_programs=None,
                        stages=STAGES):
    """decode.paged_decode on this kernel (supported() must hold): one program a multiprocessor, whole ranges for
    every KV head, then the partials merged. qk_scale: the softmax scale times log2(e)."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = num_q_heads // kv_heads
    if num_programs is None:
        num_programs = sm_count(q.device)
    num_programs = kv_heads * max(1, num_programs // kv_heads)
    part_out = torch.empty(num_programs * 2 * group * head_dim, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(num_programs * 2 * group, device=q.device, dtype=torch.float32)
    _decode_hopper[(num_programs,)](
        q, k_cache, v_cache, block_table, seq_lens, out, part_out, part_lse,
        qk_scale, num_seqs, num_programs,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), out.stride(0), out.stride(1),
        NUM_KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        SEQS_PAD=max(128, next_pow2(num_seqs)), MIN_TILES=min_tiles, STAGES=stages, num_warps=NUM_WARPS)
    merge_partials(part_out, part_lse, seq_lens, out, num_programs, num_heads=num_q_heads, units=kv_heads,
                   rows=group, head_dim=head_dim, block_n=TILE, seqs_pad=max(16, next_pow2(num_seqs)),
                   min_tiles=min_tiles)
    return out
