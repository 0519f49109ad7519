"""MLA decode in 64-head blocks on Hopper: FlashMLA's seesaw, in Gluon. The default on sm_90 for more than 16 heads
(17 to 32 in one block, the rows past the last head masked); up to 16 mla_narrow.py runs (mla.decode_config).

Two 4-warp partitions (gl.warp_specialize) each own every other 64-token tile of a segment: partition 0 the even tiles
in buffer 0, partition 1 the odd ones in buffer 1. Each scores its own tiles at n64 (no query re-read for every 32
keys, as two warpgroups splitting one tile's scores would) and keeps 256 of the 512 output columns (0 the first half,
1 the second). Per pair of tiles (A even, B odd):
  0: S_A, m_A = max(m, rowmax S_A), P_A -> A's rope slot, m_A -> shared; arrive pa.  O_L = O_L a_A + P_A V_A[L].
  1: S_B; wait pa; m_B = max(m_A, rowmax S_B), P_B -> B's rope slot, m_B -> shared; arrive pb.
     O_R = (O_R a_A + P_A V_A[R]) a_B + P_B V_B[R].
  0: wait pb; O_L = O_L a_B + P_B V_B[L].
Loads by halves, FlashMLA's way (TMA, or cp.async for a sequence's last tile, arriving on ready[buffer, half] as the
copies land): each partition loads its own half of the latent columns of every tile, and the rope keys of the other
partition's tiles, each the moment it is done with that half of the buffer's last tile. Partition 0 reads only the
left half of B and P_B (B's rope slot), partition 1 only the right half of A and P_A, so every part has one last
reader, which reloads it: no `free` barrier, and A's left half is reloaded as soon as O_L += P_A V_A[L] is done (a
whole tile loaded once both partitions are done with it leaves the copies' latency at 0.6 of a tile's time). The
scores start on a tile's own half while the other half lands.
Row sums: each partition its own tiles', in the same frame; added through shared memory at a segment's end, in slots
by the segment's parity. That exchange is also where a segment ends for both: the next one's query and first tiles
load after it. scripts/seesaw_protocol_check.py model-checks these waits and arrivals on the CPU.
Same tile line, ranges and partials as memcheck/kernels/mla.py's _mla_decode, merged by work_split.combine_cut_units.
On an H200, b256 x 4K at 1.44x of the floor; the waits for a tile's copies are the largest stall (one tile in flight a
partition does not cover the memory's latency, and shared memory, Q 72 KiB + 2 x 72 KiB, holds no third tile).
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .dispatch import launches_early, next_pow2, on_hopper, pdl_options, sm_count
from .gluon_common import (arrive_when_copied, gdc_wait_gluon, partial_row, program_range, segment, stamp_gluon,
                           tile_blocks)
from .stamps import SLOTS
from .work_split import RUN_TIME_INTS, merge_partials

HEAD_BLOCK, BLOCK_N = 64, 64
PART_WARPS, WORKER_REGS = 4, 240
# A partition's tile halves are copied by TMA (one thread, a box a cache block), not cp.async by all its 128 threads (~0.2
# us of a 2.1 us tile at 128 heads in addresses), but for a sequence's last tile (_load_half): 128h b256 x 4K 1.08x faster.
# Outputs and bf16 partials are staged in the partition's half of its own buffer and stored 16 bytes a thread, a warp's
# store one 512-byte row (_store_wide), not from the wgmma accumulators' layout (4 bytes a thread in 8 rows: half sectors).
SMEM_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
PART_WARPS_C = gl.constexpr(PART_WARPS)
WORKER_REGS_C = gl.constexpr(WORKER_REGS)


def supported(q_latent, q_pe, latent_cache, num_heads: int) -> bool:
    """This kernel's shapes: a Hopper GPU, bf16, the DeepSeek latent (512 + 64), rows that cp.async can copy 16 bytes
    at a time. Heads come in 64-head blocks, the last one masked where they are fewer."""
    rank, rope = q_latent.shape[-1], latent_cache.shape[-1] - q_latent.shape[-1]
    rows = (q_latent, q_pe, latent_cache)
    return (on_hopper(q_latent.device)
            and q_latent.dtype == latent_cache.dtype == q_pe.dtype == torch.bfloat16 and (rank, rope) == (512, 64)
            and all(t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1]) for t in rows))


@gluon.jit
def _load_half(k_lat_s, k_pe_s, BUF: gl.constexpr, HALF_IDX: gl.constexpr, ready, cache_ptr, bt_row, t0, end,
               stride_c_block, stride_c_tok, RANK: gl.constexpr, BLOCK_SIZE: gl.constexpr, ld: gl.constexpr,
               descs, TMA: gl.constexpr):
    """Half HALF_IDX (256 latent columns) of the tile at token t0 into buffer BUF, with the tile's rope keys where the
    buffer is the other partition's (BUF != HALF_IDX); the copies arrive on `ready` as they land. TMA (descs: the
    cache's latent and rope views, a cache block a box): a tile within the sequence is copied by TMA, one thread's
    copies; the sequence's last tile by cp.async, whose rows past `end` are zero-filled (0 x NaN from a slot nobody
    wrote would reach the output: their scores are masked, not their values)."""
    HALF: gl.constexpr = RANK // 2
    if TMA and t0 + 64 <= end:
        lat_desc, pe_desc = descs
        BOX: gl.constexpr = lat_desc.block_type.shape[0]
        gl.thread_barrier()  # every warp of the partition is done with what the copies overwrite
        if BUF != HALF_IDX:
            mbarrier.expect(ready, (64 // BOX) * (lat_desc.block_type.nbytes + pe_desc.block_type.nbytes))
        else:
            mbarrier.expect(ready, (64 // BOX) * lat_desc.block_type.nbytes)
        for j in gl.static_range(64 // BOX):
            box_tok = t0 + j * BOX  # the box's first token; its row in the cache's [tokens, 576] view
            box_row = gl.load(bt_row + box_tok // BLOCK_SIZE) * BLOCK_SIZE + box_tok % BLOCK_SIZE
            tma.async_copy_global_to_shared(lat_desc, [box_row, HALF_IDX * HALF], ready,
                                            k_lat_s.index(BUF).slice(HALF_IDX * HALF, HALF, dim=1).slice(j * BOX, BOX))
            if BUF != HALF_IDX:
                tma.async_copy_global_to_shared(pe_desc, [box_row, RANK], ready,
                                                k_pe_s.index(BUF).slice(j * BOX, BOX))
    else:  # cp.async, every thread its rows' columns (a tile past the sequence's end: those rows zero-filled)
        toks = gl.arange(0, 64, gl.SliceLayout(1, ld))
        tok = t0 + toks
        valid = (tok < end)[:, None]
        row = (cache_ptr + tile_blocks(bt_row, t0, end, toks, BLOCK_SIZE) * stride_c_block
               + (tok % BLOCK_SIZE) * stride_c_tok)
        cols = HALF_IDX * HALF + gl.arange(0, HALF, gl.SliceLayout(0, ld))
        cp.async_copy_global_to_shared(k_lat_s.index(BUF).slice(HALF_IDX * HALF, HALF, dim=1),
                                       row[:, None] + cols[None, :], mask=valid)
        if BUF != HALF_IDX:
            pe_cols = RANK + gl.arange(0, 64, gl.SliceLayout(0, ld))
            cp.async_copy_global_to_shared(k_pe_s.index(BUF), row[:, None] + pe_cols[None, :], mask=valid)
        arrive_when_copied(ready, TMA)


@gluon.jit
def _store_wide(o, stage, base, row_stride, rows_valid, PART_WARPS: gl.constexpr):
    """o ([rows, columns] in the wgmma accumulator's layout, in the destination's dtype) to base[row * row_stride +
    column] for the rows below rows_valid, through `stage` (shared memory of o's shape that no one else touches until
    this partition's next copies), 16 bytes a thread."""
    ROWS: gl.constexpr = o.shape[0]
    COLS: gl.constexpr = o.shape[1]
    VEC: gl.constexpr = 128 // o.dtype.primitive_bitwidth
    wide: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [PART_WARPS, 1], [1, 0])
    stage.store(o)
    gl.thread_barrier()  # every warp's rows staged
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, wide))
    cols = gl.arange(0, COLS, gl.SliceLayout(0, wide))
    gl.store(base + rows[:, None] * row_stride + cols[None, :], stage.load(wide), mask=(rows < rows_valid)[:, None])
    gl.thread_barrier()  # every warp done reading the stage before the partition's next copies overwrite it
    fence_async_shared()  # those copies may be TMA's (the async proxy)


@gluon.jit
def _scores(ME: gl.constexpr, q_lat_s, q_pe_s, k_lat_s, k_pe_s, ready, z, phase, HALF: gl.constexpr,
            s_layout: gl.constexpr):
    """This partition's tile (buffer ME) against the query: its own half first, as soon as its copies land, then
    the other half and the rope keys, which the other partition loads. z: 0, not provably (see the loop)."""
    mbarrier.wait(ready.index(3 * ME), phase)  # buffer ME, half ME
    fence_async_shared()  # the copies' data, for the async proxy (wgmma)
    s = warpgroup_mma(q_lat_s.index(z).slice(ME * HALF, HALF, dim=1),
                      k_lat_s.index(ME + z).slice(ME * HALF, HALF, dim=1).permute((1, 0)),
                      gl.zeros([64, 64], gl.float32, s_layout), is_async=True)
    mbarrier.wait(ready.index(ME + 1), phase)  # buffer ME, half 1 - ME and the rope keys
    fence_async_shared()
    s = warpgroup_mma(q_lat_s.index(z).slice((1 - ME) * HALF, HALF, dim=1),
                      k_lat_s.index(ME + z).slice((1 - ME) * HALF, HALF, dim=1).permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(0, deps=[warpgroup_mma(q_pe_s.index(z), k_pe_s.index(ME + z).permute((1, 0)), s,
                                                     is_async=True)])


@gluon.jit
def _publish_p(s, m, l, m_slot, p_slot, published):
    """A tile's softmax step from its scaled scores: the new running max, the old frame's factor, the row sums, and
    P in bf16, with the max and P stored for the other partition (P in the tile's rope slot: its scores are done with
    the rope keys) and `published` arrived on."""
    m_new = gl.maximum(m, gl.max(s, axis=1))
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(s - m_new[:, None])
    l = l * alpha + gl.sum(p, axis=1)
    p16 = p.to(gl.bfloat16)
    m_slot.store(m_new)
    p_slot.store(p16)
    fence_async_shared()  # P, for the other partition's wgmma (the async proxy)
    gl.thread_barrier()
    mbarrier.arrive(published, count=1)
    return m_new, alpha, l, p16


@gluon.jit
def _seesaw_partition(
    ME: gl.constexpr, smem, bars,
    q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, stamps_ptr,
    qk_scale, num_seqs, num_programs,
    stride_ql_seq, stride_ql_head, stride_qp_seq, stride_qp_head, stride_c_block, stride_c_tok, stride_bt_seq,
    stride_o_seq, stride_o_head,
    NUM_HEAD_BLOCKS: gl.constexpr, NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, SEQS_PAD: gl.constexpr, MIN_TILES: gl.constexpr, SHORT_LINE: gl.constexpr,
    STAMPS: gl.constexpr,
    descs, TMA: gl.constexpr, PDL: gl.constexpr,
):
    HEADS: gl.constexpr = 64
    HALF: gl.constexpr = RANK // 2
    line: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 256, 16])
    p_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_lat_s, q_pe_s, k_lat_s, k_pe_s, m_s, l_s = smem
    q_ready, ready, pa, pb, l_ready = bars
    STAMP: gl.constexpr = STAMPS and ME == 0  # memcheck/kernels/stamps.py, by partition 0
    if STAMP:
        stamp_gluon(stamps_ptr, gl.program_id(0), 0)
    if PDL:  # launched early (dispatch.launches_early): the sequence lengths, the query and the cache read only past this
        gdc_wait_gluon()
    if STAMP:
        stamp_gluon(stamps_ptr, gl.program_id(0), 1)

    head_block, first, last, seqs, lens, tiles, ends = program_range(seq_lens_ptr, num_seqs, num_programs,
                                                                      NUM_HEAD_BLOCKS, MIN_TILES, SHORT_LINE, 64,
                                                                      SEQS_PAD, line)
    if STAMP:
        stamp_gluon(stamps_ptr, gl.program_id(0), 2)
    q_heads = head_block * HEADS + gl.arange(0, HEADS, gl.SliceLayout(1, ld))
    q_rows = (q_heads < NUM_HEADS)[:, None]  # a block past the last head (fewer than 64): zeros, never stored
    lat_cols = gl.arange(0, RANK, gl.SliceLayout(0, ld))
    pe_cols = gl.arange(0, ROPE, gl.SliceLayout(0, ld))
    s_cols = gl.arange(0, 64, gl.SliceLayout(0, s_layout))
    o_rows = gl.arange(0, HEADS, rows_o)
    o_cols = ME * HALF + gl.arange(0, HALF, gl.SliceLayout(0, o_layout))
    v_own = k_lat_s.index(ME).slice(ME * HALF, HALF, dim=1)  # this partition's columns of each buffer's latent
    v_other = k_lat_s.index(1 - ME).slice(ME * HALF, HALF, dim=1)

    # Every count below follows the same schedule in both partitions, so each knows every mbarrier's phase.
    segments = 0
    fills_0 = 0  # tiles loaded into buffer 0 so far (partition 0's), and into buffer 1
    fills_1 = 0
    pairs_a = 0  # arrivals on pa, on pb so far
    pairs_b = 0
    x = first
    while x < last:
        seq, n, t_first, count, seg_end, start, end = segment(x, last, seqs, lens, tiles, ends, 64)
        bt_row = block_table_ptr + seq * stride_bt_seq
        # Both partitions are done with the last segment (the row sums' exchange below): the query and both buffers
        # are free. Each loads its half of the first two tiles, with the rope keys of the other partition's.
        if ME == 0:
            cp.async_copy_global_to_shared(q_lat_s.index(0), q_latent_ptr + seq * stride_ql_seq
                                           + q_heads[:, None] * stride_ql_head + lat_cols[None, :], mask=q_rows)
            cp.async_copy_global_to_shared(q_pe_s.index(0), q_pe_ptr + seq * stride_qp_seq
                                           + q_heads[:, None] * stride_qp_head + pe_cols[None, :], mask=q_rows)
            cp.mbarrier_arrive(q_ready, increment_count=False)
        _load_half(k_lat_s, k_pe_s, 0, ME, ready.index(ME), cache_ptr, bt_row, start, end, stride_c_block,
                   stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
        fills_0 += 1
        if count > 1:
            _load_half(k_lat_s, k_pe_s, 1, ME, ready.index(2 + ME), cache_ptr, bt_row, start + 64, end,
                       stride_c_block, stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
            fills_1 += 1
        mbarrier.wait(q_ready, segments & 1)

        m = gl.full([HEADS], float("-inf"), gl.float32, rows_s)
        l = gl.zeros([HEADS], gl.float32, rows_s)  # this partition's tiles' row sums, in the frame of m
        acc = gl.zeros([HEADS, HALF], gl.float32, o_layout)
        for k in range(0, (count + 1) // 2):
            has_b = 2 * k + 1 < count
            a_next = start + (2 * k + 2) * 64  # the tiles after this pair, in the same buffers
            b_next = a_next + 64
            # z: 0, but not provably: the scores' 72 wgmma descriptors (64-bit) are then made at each pair, not
            # hoisted out of the loop and held (ptxas: 255 registers, 45 local loads a pair).
            z = k >> 30
            if ME == 0:
                s = _scores(0, q_lat_s, q_pe_s, k_lat_s, k_pe_s, ready, z, (fills_0 - 1) & 1, HALF, s_layout)
                s = gl.where(((start + 2 * k * 64 + s_cols) < end)[None, :], s * qk_scale, float("-inf"))
                m_a, alpha_a, l, p16 = _publish_p(s, m, l, m_s.index(0), k_pe_s.index(0), pa)
                acc = acc * gl.convert_layout(alpha_a, rows_o)[:, None]
                acc = warpgroup_mma_wait(0, deps=[warpgroup_mma(gl.convert_layout(p16, p_regs), v_own, acc,
                                                                is_async=True)])
                m = m_a
                if 2 * k + 2 < count:  # done with A's left half: the next A's, while partition 1 scores B
                    _load_half(k_lat_s, k_pe_s, 0, 0, ready.index(0), cache_ptr, bt_row, a_next, end,
                               stride_c_block, stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
                if has_b:
                    mbarrier.wait(pb, pairs_b & 1)
                    mbarrier.wait(ready.index(2), (fills_1 - 1) & 1)  # B's left half, this partition's copies
                    fence_async_shared()
                    m_b = m_s.index(1).load(rows_s)
                    alpha_b = gl.exp2(m - m_b)
                    acc = acc * gl.convert_layout(alpha_b, rows_o)[:, None]
                    acc = warpgroup_mma_wait(0, deps=[warpgroup_mma(k_pe_s.index(1), v_other, acc, is_async=True)])
                    if 2 * k + 3 < count:  # done with B's left half and P_B: the next B's, with its rope keys
                        _load_half(k_lat_s, k_pe_s, 1, 0, ready.index(2), cache_ptr, bt_row, b_next, end,
                                   stride_c_block, stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
                    l = l * alpha_b
                    m = m_b
            else:
                s = gl.zeros([HEADS, 64], gl.float32, s_layout)
                if has_b:
                    s = _scores(1, q_lat_s, q_pe_s, k_lat_s, k_pe_s, ready, z, (fills_1 - 1) & 1, HALF, s_layout)
                mbarrier.wait(pa, pairs_a & 1)
                m_a = m_s.index(0).load(rows_s)
                alpha_a = gl.exp2(m - m_a)
                mbarrier.wait(ready.index(1), (fills_0 - 1) & 1)  # A's right half, this partition's copies
                fence_async_shared()
                acc = acc * gl.convert_layout(alpha_a, rows_o)[:, None]
                pv = warpgroup_mma(k_pe_s.index(0), v_other, acc, is_async=True)
                l = l * alpha_a
                m = m_a
                if has_b:
                    s = gl.where(((start + (2 * k + 1) * 64 + s_cols) < end)[None, :], s * qk_scale, float("-inf"))
                    m_b, alpha_b, l, p16 = _publish_p(s, m, l, m_s.index(1), k_pe_s.index(1), pb)
                    acc = warpgroup_mma_wait(0, deps=[pv]) * gl.convert_layout(alpha_b, rows_o)[:, None]
                    pv = warpgroup_mma(gl.convert_layout(p16, p_regs), v_own, acc, is_async=True)
                    if 2 * k + 2 < count:  # done with A's right half and P_A: the next A's, while P_B x V_B runs
                        _load_half(k_lat_s, k_pe_s, 0, 1, ready.index(1), cache_ptr, bt_row, a_next, end,
                                   stride_c_block, stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
                    acc = warpgroup_mma_wait(0, deps=[pv])
                    if 2 * k + 3 < count:  # done with B's right half
                        _load_half(k_lat_s, k_pe_s, 1, 1, ready.index(3), cache_ptr, bt_row, b_next, end,
                                   stride_c_block, stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
                    m = m_b
                else:
                    acc = warpgroup_mma_wait(0, deps=[pv])
            if 2 * k + 2 < count:
                fills_0 += 1
            if 2 * k + 3 < count:
                fills_1 += 1
            pairs_a += 1
            if has_b:
                pairs_b += 1

        # the row sums of both partitions' tiles, through shared memory; slots by the segment's parity, since one
        # partition may run a whole one-tile segment before the other reads (scripts/seesaw_protocol_check.py)
        par = (segments & 1) * 2
        l_s.index(par + ME).store(l)
        gl.thread_barrier()
        mbarrier.arrive(l_ready.index(par + ME), count=1)
        mbarrier.wait(l_ready.index(par + 1 - ME), (segments >> 1) & 1)
        l_all = gl.convert_layout(l + l_s.index(par + 1 - ME).load(rows_s), rows_o)
        whole = (t_first == 0) & (count == n)
        o = acc / l_all[:, None]
        if whole:  # staged in v_own: both are done with it (the exchange above), and only this partition
            # loads it next (its half of its own buffer)
            _store_wide(o.to(gl.bfloat16), v_own, out_ptr + seq * stride_o_seq + head_block * HEADS * stride_o_head
                        + ME * HALF, stride_o_head, NUM_HEADS - head_block * HEADS, PART_WARPS_C)
        else:  # a bf16 partial, and its float32 log-sum-exp; partials of min(HEADS, NUM_HEADS) rows
            PART_ROWS: gl.constexpr = HEADS if NUM_HEADS > HEADS else NUM_HEADS
            at = partial_row(x, first, PART_ROWS)
            _store_wide(o.to(gl.bfloat16), v_own, part_out_ptr + at * RANK + ME * HALF, RANK, PART_ROWS, PART_WARPS_C)
            if ME == 0:  # one log-sum-exp
                gl.store(part_lse_ptr + at + o_rows, gl.convert_layout(m, rows_o) + gl.log2(l_all),
                         mask=o_rows < PART_ROWS)
        segments += 1
        x = seg_end
    if STAMP:
        stamp_gluon(stamps_ptr, gl.program_id(0), 3, SM=True)


@gluon.jit(do_not_specialize=RUN_TIME_INTS)
def _mla_decode_seesaw(
    q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, stamps_ptr,
    qk_scale, num_seqs, num_programs,
    stride_ql_seq, stride_ql_head, stride_qp_seq, stride_qp_head,
    stride_c_block, stride_c_tok,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    lat_desc, pe_desc,
    NUM_HEAD_BLOCKS: gl.constexpr, NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, SEQS_PAD: gl.constexpr, MIN_TILES: gl.constexpr, SHORT_LINE: gl.constexpr,
    STAMPS: gl.constexpr,
    TMA: gl.constexpr, PDL: gl.constexpr,
):
    smem_layout: gl.constexpr = SMEM_LAYOUT  # the TMA descriptors' too
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    q_lat_s = gl.allocate_shared_memory(gl.bfloat16, [1, 64, RANK], smem_layout)
    q_pe_s = gl.allocate_shared_memory(gl.bfloat16, [1, 64, ROPE], smem_layout)
    k_lat_s = gl.allocate_shared_memory(gl.bfloat16, [2, 64, RANK], smem_layout)
    k_pe_s = gl.allocate_shared_memory(gl.bfloat16, [2, 64, ROPE], smem_layout)  # a tile's rope keys, then its P
    m_s = gl.allocate_shared_memory(gl.float32, [2, 64], flat)  # m after tile A, after tile B
    l_s = gl.allocate_shared_memory(gl.float32, [4, 64], flat)  # [segment parity][partition]
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # [buffer * 2 + half]
    pa = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pb = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=32 * PART_WARPS_C)  # cp.async arrivals: every thread of partition 0
    for b in gl.static_range(4):
        # half h: every thread of partition h (cp.async), or its one thread's expected bytes (TMA)
        mbarrier.init(ready.index(b), count=1 if TMA else 32 * PART_WARPS_C)
        mbarrier.init(l_ready.index(b), count=1)
    mbarrier.init(pa, count=1)
    mbarrier.init(pb, count=1)
    smem = (q_lat_s, q_pe_s, k_lat_s, k_pe_s, m_s, l_s)
    bars = (q_ready, ready, pa, pb, l_ready)
    # the argument tuples written out: a tuple built by `+` passes its constexprs on as plain values
    gl.warp_specialize([
        (_seesaw_partition, (0, smem, bars, q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr,
                             part_out_ptr, part_lse_ptr, stamps_ptr, qk_scale, num_seqs, num_programs, stride_ql_seq,
                             stride_ql_head, stride_qp_seq, stride_qp_head, stride_c_block, stride_c_tok, stride_bt_seq,
                             stride_o_seq, stride_o_head, NUM_HEAD_BLOCKS, NUM_HEADS, RANK, ROPE, BLOCK_SIZE, SEQS_PAD,
                             MIN_TILES, SHORT_LINE, STAMPS, (lat_desc, pe_desc), TMA, PDL)),
        (_seesaw_partition, (1, smem, bars, q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr,
                             part_out_ptr, part_lse_ptr, stamps_ptr, qk_scale, num_seqs, num_programs, stride_ql_seq,
                             stride_ql_head, stride_qp_seq, stride_qp_head, stride_c_block, stride_c_tok, stride_bt_seq,
                             stride_o_seq, stride_o_head, NUM_HEAD_BLOCKS, NUM_HEADS, RANK, ROPE, BLOCK_SIZE, SEQS_PAD,
                             MIN_TILES, SHORT_LINE, STAMPS, (lat_desc, pe_desc), TMA, PDL)),
    ], [PART_WARPS_C], [WORKER_REGS_C])


def mla_decode_seesaw(q_latent, q_pe, latent_cache, block_table, seq_lens, qk_scale, out, *, min_tiles,
                      short_line=0, num_programs=None, stamps=None):
    """Decode over one wave (one program a multiprocessor: ~216 KiB of shared memory each), then the partials merged
    (work_split.merge_partials), both launched with programmatic dependent launch where dispatch.launches_early says
    so. The cache's tiles are copied by TMA where its blocks allow (tma_loads_fit), else by cp.async. qk_scale: the
    softmax scale times log2(e); stamps: memcheck/kernels/stamps.py's buffer, or None."""
    num_seqs, num_heads, rank = q_latent.shape
    units = -(-num_heads // HEAD_BLOCK)  # the last block masked where heads are fewer (16: V2-Lite)
    if num_programs is None:
        num_programs = sm_count(q_latent.device)
    num_programs = units * max(1, num_programs // units)  # whole ranges per head block
    seqs_pad = max(64, next_pow2(num_seqs))  # ptxas rematerializes in the tile loop at 16 and 32
    rows = min(HEAD_BLOCK, num_heads)  # a partial's rows (PART_ROWS)
    part_out = torch.empty(num_programs * 2 * rows * rank, device=q_latent.device, dtype=torch.bfloat16)
    part_lse = torch.empty(num_programs * 2 * rows, device=q_latent.device, dtype=torch.float32)
    assert stamps is None or stamps.numel() >= num_programs * SLOTS
    tma_loads = tma_loads_fit(latent_cache)
    lat_desc, pe_desc = cache_descriptors(latent_cache, q_latent.shape[-1], q_pe.shape[-1], tma_loads)
    _mla_decode_seesaw[(num_programs,)](
        q_latent, q_pe, latent_cache, block_table, seq_lens, out, part_out, part_lse,
        part_lse if stamps is None else stamps, qk_scale, num_seqs, num_programs,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0), out.stride(0), out.stride(1),
        lat_desc, pe_desc,
        NUM_HEAD_BLOCKS=units, NUM_HEADS=num_heads, RANK=rank, ROPE=q_pe.shape[-1], BLOCK_SIZE=latent_cache.shape[1],
        SEQS_PAD=seqs_pad, MIN_TILES=min_tiles, SHORT_LINE=short_line, STAMPS=stamps is not None, TMA=tma_loads,
        num_warps=PART_WARPS,
        **pdl_options(launches_early(q_latent.device)))
    merge_partials(part_out, part_lse, seq_lens, out, num_programs, num_heads=num_heads, units=units, rows=rows,
                   head_dim=rank, block_n=BLOCK_N, min_tiles=min_tiles, short_line=short_line,
                   align=True)  # as program_range
    return out


def cache_descriptors(latent_cache, rank: int, rope: int, tma_loads: bool):
    """The TMA descriptors of the cache as [tokens, 576] rows, a box a cache block (a 64-token tile's at most): half
    the latent (a box is at most 256 wide), the rope keys. Without TMA the cache itself (unused by the kernel)."""
    if not tma_loads:
        return latent_cache, latent_cache
    flat = latent_cache.view(-1, latent_cache.shape[-1])
    box = min(latent_cache.shape[1], 64)
    return tuple(TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [box, cols], SMEM_LAYOUT.value)
                 for cols in (rank // 2, rope))


def tma_loads_fit(latent_cache) -> bool:
    """Whether TMA can copy the cache a block a box: blocks of a power of two tokens, at least 8 (the shared layout's
    swizzle rows), each block's rows evenly strided after the last block's."""
    blocks, block_size, width = latent_cache.shape
    return (block_size >= 8 and block_size & (block_size - 1) == 0 and latent_cache.stride(2) == 1
            and latent_cache.stride(0) == block_size * latent_cache.stride(1)
            and latent_cache.stride(1) * latent_cache.element_size() % 16 == 0 and latent_cache.data_ptr() % 16 == 0)
