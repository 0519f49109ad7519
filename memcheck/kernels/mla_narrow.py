"""MLA decode for 32 heads or fewer on Hopper, in Gluon: the heads as the products' N dimension.

At 16 and 32 heads (V2-Lite; V2/V3 over 8 and 4 tensor-parallel ranks) the seesaw (mla_seesaw.py) pads every tile's
products to 64 rows of heads, wgmma's least M: 121 FLOP a cache byte, the tensor pipe busy ~42% of a memory-bound
layer, its two tile buffers holding data being multiplied rather than requests. Here the tokens are M and the heads N
(wgmma takes N of 8 to 256), so a 64-token tile costs its heads' products only:
  scores^T [64 tokens, H] = K [64, 576] . Q^T [576, H]       (K the tile as copied; Q^T the query's view, K-major)
  out^T   [512, H]       += V^T [512, 64] . P^T [64, H]       (V^T the tile's latent read transposed from shared memory)
4x fewer tensor cycles a tile at 16 heads, 2x at 32. A warpgroup for each 16 heads: its own columns of the scores,
softmax and output (an accumulator of 64 registers a thread), the softmax down a column (a head's tokens, across its
4 warps); the warpgroups share the tiles.

Loads run ahead across a program's whole range, not a segment at a time: the tile two ahead on the range (in this
sequence or the next) is requested into a buffer the moment its last products are done, with its sequence's query
into the other of two query buffers, so a segment's start waits on nothing its predecessor could have requested.
Tiles within a sequence are copied by TMA (a cache block a box), a sequence's last tile by cp.async, whose rows past
its end are zero-filled (0 x NaN from a slot nobody wrote would reach the output: their scores are masked, not their
values).
Same tile line, ranges and partials as mla_seesaw.py, merged by work_split.merge_partials.
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .dispatch import launches_early, next_pow2, on_hopper, pdl_options, sm_count
from .gluon_common import (arrive_when_copied, gdc_launch_dependents_gluon, gdc_wait_gluon, partial_row, program_range, segment, stamp_gluon,
                           tile_blocks)
from .mla_seesaw import cache_descriptors, tma_loads_fit
from .stamps import SLOTS
from .work_split import RUN_TIME_INTS, merge_partials

TILE, MOST_HEADS = 64, 32
TILE_C = gl.constexpr(TILE)


def supported(q_latent, q_pe, latent_cache, num_heads: int) -> bool:
    """This kernel's shapes: a Hopper GPU, bf16, the DeepSeek latent (512 + 64), 32 heads or fewer, rows cp.async can
    copy 16 bytes at a time."""
    rank, rope = q_latent.shape[-1], latent_cache.shape[-1] - q_latent.shape[-1]
    rows = (q_latent, q_pe, latent_cache)
    return (num_heads <= MOST_HEADS and on_hopper(q_latent.device)
            and q_latent.dtype == latent_cache.dtype == q_pe.dtype == torch.bfloat16 and (rank, rope) == (512, 64)
            and all(t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1]) for t in rows))


@gluon.jit
def _load_query(q_lat_s, q_pe_s, ready, q_latent_ptr, q_pe_ptr, seq, stride_ql_seq, stride_ql_head, stride_qp_seq,
                stride_qp_head, NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr, ld: gl.constexpr):
    """A sequence's query into one query buffer by cp.async (its rows past the last head zero-filled), arriving on
    `ready` as every thread's copies land."""
    HP: gl.constexpr = q_lat_s.shape[0]
    heads = gl.arange(0, HP, gl.SliceLayout(1, ld))
    valid = (heads < NUM_HEADS)[:, None]
    lat_cols = gl.arange(0, RANK, gl.SliceLayout(0, ld))
    pe_cols = gl.arange(0, ROPE, gl.SliceLayout(0, ld))
    cp.async_copy_global_to_shared(q_lat_s, q_latent_ptr + seq * stride_ql_seq + heads[:, None] * stride_ql_head
                                   + lat_cols[None, :], mask=valid)
    cp.async_copy_global_to_shared(q_pe_s, q_pe_ptr + seq * stride_qp_seq + heads[:, None] * stride_qp_head
                                   + pe_cols[None, :], mask=valid)
    cp.mbarrier_arrive(ready, increment_count=False)


@gluon.jit
def _load_tile(k_lat_s, k_pe_s, ready, cache_ptr, bt_row, t0, end, stride_c_block, stride_c_tok, RANK: gl.constexpr,
               BLOCK_SIZE: gl.constexpr, ld: gl.constexpr, descs, TMA: gl.constexpr):
    """The tile of a sequence at token t0 into one buffer (latent [64, 512], rope keys [64, 64]), arriving on
    `ready`: by TMA within the sequence (one thread's copies, a cache block a box, the latent in two halves: a box
    is at most 256 wide), by cp.async for its last tile, rows past `end` zero-filled."""
    HALF: gl.constexpr = RANK // 2
    if TMA and t0 + TILE_C <= end:
        lat_desc, pe_desc = descs
        BOX: gl.constexpr = lat_desc.block_type.shape[0]
        mbarrier.expect(ready, (TILE_C // BOX) * (2 * lat_desc.block_type.nbytes + pe_desc.block_type.nbytes))
        for j in gl.static_range(TILE_C // BOX):
            box_tok = t0 + j * BOX  # the box's first token; its row in the cache's [tokens, 576] view
            box_row = gl.load(bt_row + box_tok // BLOCK_SIZE) * BLOCK_SIZE + box_tok % BLOCK_SIZE
            for h in gl.static_range(2):
                tma.async_copy_global_to_shared(lat_desc, [box_row, h * HALF], ready,
                                                k_lat_s.slice(h * HALF, HALF, dim=1).slice(j * BOX, BOX))
            tma.async_copy_global_to_shared(pe_desc, [box_row, RANK], ready, k_pe_s.slice(j * BOX, BOX))
    else:
        toks = gl.arange(0, TILE_C, gl.SliceLayout(1, ld))
        tok = t0 + toks
        valid = (tok < end)[:, None]
        row = (cache_ptr + tile_blocks(bt_row, t0, end, toks, BLOCK_SIZE) * stride_c_block
               + (tok % BLOCK_SIZE) * stride_c_tok)
        cols = gl.arange(0, RANK, gl.SliceLayout(0, ld))
        cp.async_copy_global_to_shared(k_lat_s, row[:, None] + cols[None, :], mask=valid)
        pe_cols = RANK + gl.arange(0, k_pe_s.shape[1], gl.SliceLayout(0, ld))
        cp.async_copy_global_to_shared(k_pe_s, row[:, None] + pe_cols[None, :], mask=valid)
        arrive_when_copied(ready, TMA)


@gluon.jit
def _store_heads(o, base, head_stride, NUM_HEADS: gl.constexpr):
    """o ([512 columns, heads] in the accumulator's layout) to base[head * head_stride + column], heads below
    NUM_HEADS: each thread's pairs of heads at 8 consecutive columns a warp row, 16 bytes a head."""
    cols = gl.arange(0, o.shape[0], gl.SliceLayout(1, o.type.layout))
    heads = gl.arange(0, o.shape[1], gl.SliceLayout(0, o.type.layout))
    gl.store(base + heads[None, :] * head_stride + cols[:, None], o, mask=(heads < NUM_HEADS)[None, :])


@gluon.jit(do_not_specialize=RUN_TIME_INTS)
def _mla_decode_narrow(
    q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, stamps_ptr,
    qk_scale, num_seqs, num_programs,
    stride_ql_seq, stride_ql_head, stride_qp_seq, stride_qp_head,
    stride_c_block, stride_c_tok,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    lat_desc, pe_desc,
    NUM_HEADS: gl.constexpr, HP: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, SEQS_PAD: gl.constexpr, MIN_TILES: gl.constexpr, STAMPS: gl.constexpr,
    TMA: gl.constexpr, PDL: gl.constexpr, WARPS: gl.constexpr, TRIGGER: gl.constexpr,
):
    line: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    # a warpgroup 16 heads (its own columns of scores, softmax and output): the accumulator 64 registers a thread
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WARPS // 4],
                                                       instr_shape=[16, 16, 16])
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)  # a value a head (scores and output share the layout)
    big: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    p_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * HP, element_bitwidth=16, rank=2)
    q_lat_s = gl.allocate_shared_memory(gl.bfloat16, [2, HP, RANK], big)  # by segment parity
    q_pe_s = gl.allocate_shared_memory(gl.bfloat16, [2, HP, ROPE], big)
    k_lat_s = gl.allocate_shared_memory(gl.bfloat16, [2, TILE_C, RANK], big)  # by tile parity on the range
    k_pe_s = gl.allocate_shared_memory(gl.bfloat16, [2, TILE_C, ROPE], big)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [TILE_C, HP], p_smem)  # P^T, the PV product's B
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(q_ready.index(j), count=32 * WARPS)  # cp.async arrivals: every thread
        mbarrier.init(ready.index(j), count=1 if TMA else 32 * WARPS)
    descs = (lat_desc, pe_desc)

    if STAMPS:  # memcheck/kernels/stamps.py
        stamp_gluon(stamps_ptr, gl.program_id(0), 0)
    if PDL:  # launched early (dispatch.launches_early): the sequence lengths, the query and the cache read only past this
        gdc_wait_gluon()
    if STAMPS:
        stamp_gluon(stamps_ptr, gl.program_id(0), 1)
    _, first, last, seqs, lens, tiles, ends = program_range(seq_lens_ptr, num_seqs, num_programs, 1, MIN_TILES, 0,
                                                            TILE_C, SEQS_PAD, line)
    if STAMPS:
        stamp_gluon(stamps_ptr, gl.program_id(0), 2)
    s_rows = gl.arange(0, TILE_C, gl.SliceLayout(1, s_layout))

    # The loader: the segment holding the next tile to request, its query's buffer by the count of segments
    # requested (the first request starts one). Tile y goes into buffer (y - first) % 2.
    l_seq = first
    l_seg_end = first
    l_start = first
    l_end = first
    l_x0 = first
    l_segs = 0
    # The consumer: the segment holding tile x, its running max and row sums (a value a head) and output.
    seq, n, t_first, count, seg_end, start, end = segment(first, last, seqs, lens, tiles, ends, TILE_C)
    x0 = first
    segs = 0
    m = gl.full([HP], float("-inf"), gl.float32, cols_s)
    l = gl.zeros([HP], gl.float32, cols_s)
    acc = gl.zeros([RANK, HP], gl.float32, s_layout)
    for x in range(first - 2, last):  # the first two steps only request tiles
        i = x - first
        buf = (i + 2) % 2  # C's remainder: i + 2 >= 0
        if x >= first:
            if x == x0:
                mbarrier.wait(q_ready.index(segs % 2), (segs // 2) & 1)
            mbarrier.wait(ready.index(buf), (i // 2) & 1)
            if STAMPS:  # the first tile's data in (stamps.FIRST_IN); a constexpr slot, as the others
                if i == 0:
                    stamp_gluon(stamps_ptr, gl.program_id(0), 4)
            fence_async_shared()  # the copies' data, for the async proxy (wgmma)
            qb = segs % 2
            s = warpgroup_mma(k_lat_s.index(buf), q_lat_s.index(qb).permute((1, 0)),
                              gl.zeros([TILE_C, HP], gl.float32, s_layout), is_async=True)
            s = warpgroup_mma_wait(0, deps=[warpgroup_mma(k_pe_s.index(buf), q_pe_s.index(qb).permute((1, 0)), s,
                                                          is_async=True)])
            t0 = start + (x - x0) * TILE_C
            s = gl.where(((t0 + s_rows) < end)[:, None], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m, gl.max(s, axis=0))
            alpha = gl.exp2(m - m_new)
            p = gl.exp2(s - m_new[None, :])
            l = l * alpha + gl.sum(p, axis=0)
            m = m_new
            p_s.store(p.to(gl.bfloat16))
            fence_async_shared()  # P^T, for wgmma
            gl.thread_barrier()  # every warp's rows of P^T stored
            acc = acc * alpha[None, :]
            acc = warpgroup_mma_wait(0, deps=[warpgroup_mma(k_lat_s.index(buf).permute((1, 0)), p_s, acc,
                                                            is_async=True)])
            gl.thread_barrier()  # every warp done with this buffer and P^T
            if STAMPS:  # its products done (stamps.FIRST_DONE)
                if i == 0:
                    stamp_gluon(stamps_ptr, gl.program_id(0), 5)

            if x + 1 == seg_end:  # the segment's output: whole, or a partial and its log-sum-exp
                o = (acc / l[None, :]).to(gl.bfloat16)
                if (t_first == 0) & (count == n):
                    _store_heads(o, out_ptr + seq * stride_o_seq, stride_o_head, NUM_HEADS)
                else:
                    at = partial_row(x0, first, NUM_HEADS)
                    _store_heads(o, part_out_ptr + at * RANK, RANK, NUM_HEADS)
                    hs = gl.arange(0, HP, cols_s)
                    gl.store(part_lse_ptr + at + hs, m + gl.log2(l), mask=hs < NUM_HEADS)
                segs += 1
                if x + 1 < last:
                    seq, n, t_first, count, seg_end, start, end = segment(x + 1, last, seqs, lens, tiles, ends,
                                                                          TILE_C)
                    x0 = x + 1
                m = gl.full([HP], float("-inf"), gl.float32, cols_s)
                l = gl.zeros([HP], gl.float32, cols_s)
                acc = gl.zeros([RANK, HP], gl.float32, s_layout)

        y = x + 2  # into this buffer, now free: the tile two ahead, with its sequence's query where it starts one
        if y < last:
            if y >= l_seg_end:
                l_seq, _, _, _, l_seg_end, l_start, l_end = segment(y, last, seqs, lens, tiles, ends, TILE_C)
                l_x0 = y
                _load_query(q_lat_s.index(l_segs % 2), q_pe_s.index(l_segs % 2), q_ready.index(l_segs % 2),
                            q_latent_ptr, q_pe_ptr, l_seq, stride_ql_seq, stride_ql_head, stride_qp_seq,
                            stride_qp_head, NUM_HEADS, RANK, ROPE, ld)
                l_segs += 1
            _load_tile(k_lat_s.index(buf), k_pe_s.index(buf), ready.index(buf), cache_ptr,
                       block_table_ptr + l_seq * stride_bt_seq, l_start + (y - l_x0) * TILE_C, l_end, stride_c_block,
                       stride_c_tok, RANK, BLOCK_SIZE, ld, descs, TMA)
            if PDL and TRIGGER and y + 1 == last:  # its last request made: the merge's programs may take their places
                gdc_launch_dependents_gluon()
    if STAMPS:
        stamp_gluon(stamps_ptr, gl.program_id(0), 3, SM=True)


def mla_decode_narrow(q_latent, q_pe, latent_cache, block_table, seq_lens, qk_scale, out, *, min_tiles,
                      num_programs=None, stamps=None, trigger=False):
    """Decode over one wave (one program a multiprocessor: 182 KiB of shared memory at 16 heads, 220 at 32), then
    the partials merged (work_split.merge_partials), both launched with programmatic dependent launch where
    dispatch.launches_early says so. qk_scale: the softmax scale times log2(e); stamps: stamps.py's buffer, or None;
    trigger: the merge launched once each program has requested its last tile, not once all have ended."""
    num_seqs, num_heads, rank = q_latent.shape
    if num_programs is None:
        num_programs = sm_count(q_latent.device)
    seqs_pad = max(64, next_pow2(num_seqs))
    heads_pad = max(16, next_pow2(num_heads))
    warps = 4 * heads_pad // 16  # a warpgroup 16 heads
    part_out = torch.empty(num_programs * 2 * num_heads * rank, device=q_latent.device, dtype=torch.bfloat16)
    part_lse = torch.empty(num_programs * 2 * num_heads, device=q_latent.device, dtype=torch.float32)
    assert stamps is None or stamps.numel() >= num_programs * SLOTS
    tma_loads = tma_loads_fit(latent_cache)
    lat_desc, pe_desc = cache_descriptors(latent_cache, rank, q_pe.shape[-1], tma_loads)
    _mla_decode_narrow[(num_programs,)](
        q_latent, q_pe, latent_cache, block_table, seq_lens, out, part_out, part_lse,
        part_lse if stamps is None else stamps, qk_scale, num_seqs, num_programs,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0), out.stride(0), out.stride(1),
        lat_desc, pe_desc,
        NUM_HEADS=num_heads, HP=heads_pad, RANK=rank, ROPE=q_pe.shape[-1],
        BLOCK_SIZE=latent_cache.shape[1], SEQS_PAD=seqs_pad, MIN_TILES=min_tiles, STAMPS=stamps is not None,
        TMA=tma_loads, WARPS=warps, TRIGGER=trigger, num_warps=warps, **pdl_options(launches_early(q_latent.device)))
    merge_partials(part_out, part_lse, seq_lens, out, num_programs, num_heads=num_heads, units=1, rows=num_heads,
                   head_dim=rank, block_n=TILE, min_tiles=min_tiles, align=True)  # as program_range
    return out
