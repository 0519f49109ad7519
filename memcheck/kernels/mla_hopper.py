"""MLA decode in 64-head blocks on Hopper (sm_90), in Gluon: the 128-head (V2/V3) decode, which the H200 runs
compute-bound (fewer heads than a block: its rows past the last head load zeros and are never stored).

Same work as memcheck/kernels/mla.py's _mla_decode at 64-head blocks (same split of the tile line into ranges, same partials
for work_split.combine_cut_units), with the layouts Triton's compiler cannot choose: Triton gives the scores'
product all 8 warps along M when it feeds a second product, so with 64 rows both warpgroups compute the same 64 x 64
scores (half the kernel's tensor-core work wasted; ncu, kernels_h200_2026-12-02_notes.md). Here the two warpgroups
split the scores by key columns (32 tokens each, warps [4, 2]), and the output by latent columns (256 each); P goes
through shared memory, into the slot of the tile's rope keys, which its scores no longer need: the query (72 KiB) and
two 64-token latent tiles (144 KiB) fill 216 of the 227 KiB. The next tile's cp.async gather runs under this one's
products. On an H200, 1.14-1.56x faster than _mla_decode on 11 128-head cells
(benchmarks/results/mla_hopper_h200_2026-12-02_*_run-5); its answers there are checked by benchmarks/mla_hopper_h200.py,
as Triton's interpreter cannot run Gluon.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .dispatch import next_pow2, on_hopper, sm_count
from .stamps import SLOTS
from .work_split import ALIGN_TILES, RUN_TIME_INTS, merge_partials

HEAD_BLOCK, BLOCK_N, NUM_WARPS = 64, 64, 8


def supported(q_latent, q_pe, latent_cache, num_heads: int) -> bool:
    """This kernel's shapes: a Hopper GPU, bf16, the DeepSeek latent (512 + 64), rows that cp.async can copy 16 bytes
    at a time. Heads come in 64-head blocks, the last one masked where they are fewer."""
    rank, rope = q_latent.shape[-1], latent_cache.shape[-1] - q_latent.shape[-1]
    rows = (q_latent, q_pe, latent_cache)
    return (on_hopper(q_latent.device)
            and q_latent.dtype == latent_cache.dtype == q_pe.dtype == torch.bfloat16 and (rank, rope) == (512, 64)
            and all(t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1]) for t in rows))


# The tile line of memcheck/kernels/work_split.py, in Gluon's explicit layouts (Gluon cannot call Triton's jit functions).
@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _range_start(j, ranges, total):
    return (j.to(gl.int64) * total // ranges).to(gl.int32)


@gluon.jit
def _program_range(seq_lens_ptr, num_seqs, num_programs, NUM_HEAD_BLOCKS: gl.constexpr, MIN_TILES: gl.constexpr,
                   TILE: gl.constexpr, SEQS_PAD: gl.constexpr, line: gl.constexpr):
    """This program's head block and its range [first, last) of the tile line (every sequence's tiles end to end),
    with the line per sequence: index, length, tiles, and where its tiles end."""
    pid = gl.program_id(0)
    seqs = gl.arange(0, SEQS_PAD, line)
    lens = gl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    tiles = (lens + TILE - 1) // TILE
    ends = gl.associative_scan(tiles, 0, _add)
    total = gl.sum(tiles, 0)
    most = gl.maximum(1, gl.minimum(num_programs // NUM_HEAD_BLOCKS, total // MIN_TILES))  # line_ranges, ALIGN
    busy = gl.maximum(1, gl.sum((tiles > 0).to(gl.int32), 0))
    aligned = most // busy * busy
    ranges = gl.where((aligned > 0) & ((most - aligned) * total <= ALIGN_TILES * most * most), aligned, most)
    j = pid // NUM_HEAD_BLOCKS
    first = _range_start(gl.minimum(j, ranges), ranges, total)
    last = _range_start(gl.minimum(j + 1, ranges), ranges, total)
    return pid % NUM_HEAD_BLOCKS, first, last, seqs, lens, tiles, ends


@gluon.jit
def gdc_wait_gluon():
    """Triton's gdc_wait in Gluon: past this, the kernel before this one (PDL: dispatch.pdl_options) has finished
    and its writes are visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def stamp_gluon(stamps_ptr, row, SLOT: gl.constexpr, WIDTH: gl.constexpr = SLOTS, SM: gl.constexpr = False):
    """memcheck/kernels/stamps.py's stamp, in Gluon (rows of WIDTH slots); SM: the multiprocessor too, in the row's last slot."""
    now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(stamps_ptr + row * WIDTH + SLOT, now)
    if SM:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.store(stamps_ptr + row * WIDTH + WIDTH - 1, sm.to(gl.int64))


@gluon.jit
def _segment(x, last, seqs, lens, tiles, ends, TILE: gl.constexpr):
    """The sequence holding tile x and this range's part of it: the sequence, its tiles, the part's first tile in
    it, its tiles, where it ends on the line, and its first and past-the-end tokens."""
    seq = gl.sum((ends <= x).to(gl.int32), 0)
    here = seqs == seq
    n = gl.sum(gl.where(here, tiles, 0), 0)
    seq_end = gl.sum(gl.where(here, ends, 0), 0)
    seq_len = gl.sum(gl.where(here, lens, 0), 0)
    t_first = x - (seq_end - n)
    seg_end = gl.minimum(last, seq_end)
    count = seg_end - x
    return seq, n, t_first, count, seg_end, t_first * TILE, gl.minimum((t_first + count) * TILE, seq_len)


@gluon.jit
def _tile_blocks(bt_row, t0, end, toks, BLOCK_SIZE: gl.constexpr):
    """The cache block of each token t0.. of a sequence (0 past `end`): loaded a tile ahead of its copy, so the copy
    does not wait on the block table."""
    tok = t0 + toks
    return gl.load(bt_row + tok // BLOCK_SIZE, mask=tok < end, other=0).to(gl.int64)


@gluon.jit
def _load_tile(k_lat, k_pe, cache_ptr, blocks, t0, end, stride_c_block, stride_c_tok, toks, lat_cols, pe_cols,
               RANK: gl.constexpr, BLOCK_SIZE: gl.constexpr):
    """Gather tokens t0.. of a sequence from their cache blocks into a tile; rows past `end` are zero-filled."""
    tok = t0 + toks
    valid = tok < end
    row = cache_ptr + blocks * stride_c_block + (tok % BLOCK_SIZE) * stride_c_tok
    cp.async_copy_global_to_shared(k_lat, row[:, None] + lat_cols[None, :], mask=valid[:, None])
    cp.async_copy_global_to_shared(k_pe, row[:, None] + RANK + pe_cols[None, :], mask=valid[:, None])


@gluon.jit
def _scores(q_lat_s, q_pe_s, k_lat, k_pe, HEADS: gl.constexpr, TILE: gl.constexpr, s_layout: gl.constexpr):
    """Issue a tile's scores (latent, then rope) on the tensor cores; returns the pending accumulator."""
    s = warpgroup_mma(q_lat_s, k_lat.permute((1, 0)), gl.zeros([HEADS, TILE], gl.float32, s_layout), is_async=True)
    return warpgroup_mma(q_pe_s, k_pe.permute((1, 0)), s, is_async=True)


@gluon.jit
def _tile_landed():
    """After the cp.async wait: every thread's copies visible to wgmma (the async proxy) and to the other warps."""
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _partial_row(x, first, PART_ROWS: gl.constexpr):
    """The first row of this program's partial of the sequence starting at tile x: slot 0 for the range's first
    sequence, 1 for its last (work_split's layout, which combine_cut_units reads)."""
    return (gl.program_id(0) * 2 + (x != first).to(gl.int32)) * PART_ROWS


@gluon.jit
def _store_segment(o, m, l, rows_o: gl.constexpr, whole, x, first, seq, head_block, o_rows, o_cols, out_ptr,
                   part_out_ptr, part_lse_ptr, stride_o_seq, stride_o_head, HEADS: gl.constexpr,
                   NUM_HEADS: gl.constexpr, RANK: gl.constexpr, STORE_LSE: gl.constexpr):
    """A segment's output o (its columns o_cols): the sequence's answer in bf16 if the segment is all of it, else a
    float32 partial with its log-sum-exp m + log2(l) (l in layout rows_o), slot 0 for the range's first sequence and 1
    for its last (work_split.store_range_result). Partials hold min(HEADS, NUM_HEADS) rows: one long sequence
    writes a partial a program, and 16 heads' are a quarter of a 64-head block's 128 KiB."""
    if whole:
        heads = head_block * HEADS + o_rows
        o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head
        gl.store(o_ptrs + o_cols[None, :], o.to(gl.bfloat16), mask=(heads < NUM_HEADS)[:, None])
    else:
        PART_ROWS: gl.constexpr = HEADS if NUM_HEADS > HEADS else NUM_HEADS
        at = _partial_row(x, first, PART_ROWS) + o_rows
        held = o_rows < PART_ROWS
        gl.store(part_out_ptr + at[:, None] * RANK + o_cols[None, :], o.to(part_out_ptr.dtype.element_ty),
                 mask=held[:, None])
        if STORE_LSE:
            gl.store(part_lse_ptr + at, gl.convert_layout(m, rows_o) + gl.log2(l), mask=held)


@gluon.jit(do_not_specialize=RUN_TIME_INTS)
def _mla_decode_hopper(
    q_latent_ptr, q_pe_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, stamps_ptr,
    qk_scale, num_seqs, num_programs,
    stride_ql_seq, stride_ql_head, stride_qp_seq, stride_qp_head,
    stride_c_block, stride_c_tok,
    stride_bt_seq,
    stride_o_seq, stride_o_head,
    NUM_HEAD_BLOCKS: gl.constexpr, NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, SEQS_PAD: gl.constexpr, MIN_TILES: gl.constexpr, STAMPS: gl.constexpr,
):
    """Range j of head block `pid % NUM_HEAD_BLOCKS`'s tile line, as _mla_decode. STAMPS: memcheck/kernels/stamps.py."""
    HEADS: gl.constexpr = 64
    TILE: gl.constexpr = 64
    line: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])  # 16-byte copies
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16])
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_lat_s = gl.allocate_shared_memory(gl.bfloat16, [HEADS, RANK], smem)
    q_pe_s = gl.allocate_shared_memory(gl.bfloat16, [HEADS, ROPE], smem)
    k_lat_s = gl.allocate_shared_memory(gl.bfloat16, [2, TILE, RANK], smem)
    k_pe_s = gl.allocate_shared_memory(gl.bfloat16, [2, TILE, ROPE], smem)  # a tile's rope keys, then its P
    if STAMPS:
        stamp_gluon(stamps_ptr, gl.program_id(0), 0)
        stamp_gluon(stamps_ptr, gl.program_id(0), 1)  # no griddepcontrol.wait: waited as started

    head_block, first, last, seqs, lens, tiles, ends = _program_range(seq_lens_ptr, num_seqs, num_programs,
                                                                      NUM_HEAD_BLOCKS, MIN_TILES, TILE, SEQS_PAD, line)
    if STAMPS:
        stamp_gluon(stamps_ptr, gl.program_id(0), 2)

    q_heads = head_block * HEADS + gl.arange(0, HEADS, gl.SliceLayout(1, ld))
    q_rows = (q_heads < NUM_HEADS)[:, None]  # a block past the last head (fewer than 64): zeros, never stored
    toks = gl.arange(0, TILE, gl.SliceLayout(1, ld))
    lat_cols = gl.arange(0, RANK, gl.SliceLayout(0, ld))
    pe_cols = gl.arange(0, ROPE, gl.SliceLayout(0, ld))
    o_rows = gl.arange(0, HEADS, gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, RANK, gl.SliceLayout(0, o_layout))
    s_cols = gl.arange(0, TILE, gl.SliceLayout(0, s_layout))

    x = first
    while x < last:
        seq, n, t_first, count, seg_end, start, end = _segment(x, last, seqs, lens, tiles, ends, TILE)
        bt_row = block_table_ptr + seq * stride_bt_seq

        cp.async_copy_global_to_shared(q_lat_s, q_latent_ptr + seq * stride_ql_seq
                                       + q_heads[:, None] * stride_ql_head + lat_cols[None, :], mask=q_rows)
        cp.async_copy_global_to_shared(q_pe_s, q_pe_ptr + seq * stride_qp_seq
                                       + q_heads[:, None] * stride_qp_head + pe_cols[None, :], mask=q_rows)
        _load_tile(k_lat_s.index(0), k_pe_s.index(0), cache_ptr, _tile_blocks(bt_row, start, end, toks, BLOCK_SIZE),
                   start, end, stride_c_block, stride_c_tok, toks, lat_cols, pe_cols, RANK, BLOCK_SIZE)
        cp.commit_group()
        if count > 1:
            _load_tile(k_lat_s.index(1), k_pe_s.index(1), cache_ptr,
                       _tile_blocks(bt_row, start + TILE, end, toks, BLOCK_SIZE), start + TILE, end, stride_c_block,
                       stride_c_tok, toks, lat_cols, pe_cols, RANK, BLOCK_SIZE)
        cp.commit_group()  # one group a tile, empty or not: wait_group(1) is then always this tile's
        blocks_next = _tile_blocks(bt_row, start + 2 * TILE, end, toks, BLOCK_SIZE)

        m = gl.full([HEADS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_acc = gl.zeros([HEADS, TILE], gl.float32, s_layout)  # row sums, reduced once at the end
        acc = gl.zeros([HEADS, RANK], gl.float32, o_layout)
        for i in range(0, count):
            buf = i % 2
            k_lat = k_lat_s.index(buf)
            k_pe = k_pe_s.index(buf)
            cp.wait_group(1)
            _tile_landed()
            s = warpgroup_mma_wait(0, deps=[_scores(q_lat_s, q_pe_s, k_lat, k_pe, HEADS, TILE, s_layout)])
            valid = (start + i * TILE + s_cols) < end
            s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m, gl.max(s, axis=1))
            alpha = gl.exp2(m - m_new)
            p = gl.exp2(s - m_new[:, None])
            l_acc = l_acc * alpha[:, None] + p
            m = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            gl.thread_barrier()  # both warpgroups' scores have read the rope keys P replaces
            k_pe.store(p.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            acc = warpgroup_mma_wait(0, deps=[warpgroup_mma(k_pe, k_lat, acc, is_async=True)])
            gl.thread_barrier()  # the buffer is free for tile i + 2
            if i + 2 < count:
                _load_tile(k_lat, k_pe, cache_ptr, blocks_next, start + (i + 2) * TILE, end, stride_c_block,
                           stride_c_tok, toks, lat_cols, pe_cols, RANK, BLOCK_SIZE)
            cp.commit_group()
            blocks_next = _tile_blocks(bt_row, start + (i + 3) * TILE, end, toks, BLOCK_SIZE)

        l_out = gl.convert_layout(gl.sum(l_acc, axis=1), gl.SliceLayout(1, o_layout))
        _store_segment(acc / l_out[:, None], m, l_out, gl.SliceLayout(1, o_layout), (t_first == 0) & (count == n), x,
                       first, seq, head_block, o_rows, o_cols, out_ptr, part_out_ptr, part_lse_ptr, stride_o_seq,
                       stride_o_head, HEADS, NUM_HEADS, RANK, True)
        x = seg_end
    if STAMPS:
        stamp_gluon(stamps_ptr, gl.program_id(0), 3, SM=True)


def launch(kernel, num_warps, q_latent, q_pe, latent_cache, block_table, seq_lens, qk_scale, out, *, min_tiles,
           num_programs=None, partials=torch.float32, stamps=None, **extra):
    """Launch a 64-head-block decode kernel of this file's arguments, tile line and partials (mla_hopper's or
    mla_seesaw's) over one wave (one program a multiprocessor: ~216 KiB of shared memory each), then merge the
    partials. qk_scale: the softmax scale times log2(e); stamps: memcheck/kernels/stamps.py's buffer, or None; extra: the
    kernel's own further arguments, by name."""
    num_seqs, num_heads, rank = q_latent.shape
    units = -(-num_heads // HEAD_BLOCK)  # the last block masked where heads are fewer (16: V2-Lite)
    if num_programs is None:
        num_programs = sm_count(q_latent.device)
    num_programs = units * max(1, num_programs // units)  # whole ranges per head block
    # ptxas rematerializes in mla_hopper's tile loop at 16 and 32 padded sequences (725 instructions a tile, not 552;
    # with the run-3 code it spilled there: 55 local loads a tile at 16), not from 64 to 1024
    seqs_pad = max(64, next_pow2(num_seqs))
    rows = min(HEAD_BLOCK, num_heads)  # a partial's rows (_store_segment's PART_ROWS)
    part_out = torch.empty(num_programs * 2 * rows * rank, device=q_latent.device, dtype=partials)
    part_lse = torch.empty(num_programs * 2 * rows, device=q_latent.device, dtype=torch.float32)
    assert stamps is None or stamps.numel() >= num_programs * SLOTS
    kernel[(num_programs,)](
        q_latent, q_pe, latent_cache, block_table, seq_lens, out, part_out, part_lse,
        part_lse if stamps is None else stamps, qk_scale, num_seqs, num_programs,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0), out.stride(0), out.stride(1),
        NUM_HEAD_BLOCKS=units, NUM_HEADS=num_heads, RANK=rank, ROPE=q_pe.shape[-1], BLOCK_SIZE=latent_cache.shape[1],
        SEQS_PAD=seqs_pad, MIN_TILES=min_tiles, STAMPS=stamps is not None, num_warps=num_warps, **extra)
    merge_partials(part_out, part_lse, seq_lens, out, num_programs, num_heads=num_heads, units=units, rows=rows,
                   head_dim=rank, block_n=BLOCK_N, min_tiles=min_tiles, align=True)  # as _program_range
    return out


def mla_decode_hopper(q_latent, q_pe, latent_cache, block_table, seq_lens, qk_scale, out, *, min_tiles,
                      num_programs=None, partials=torch.float32, stamps=None):
    """Decode with _mla_decode_hopper (see launch)."""
    return launch(_mla_decode_hopper, NUM_WARPS, q_latent, q_pe, latent_cache, block_table, seq_lens, qk_scale, out,
                  min_tiles=min_tiles, num_programs=num_programs, partials=partials, stamps=stamps)
