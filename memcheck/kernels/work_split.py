"""Even split of decode work over a one-wave grid (split-context / flash-decoding, balanced).

A unit of work is one head group (a KV head, or a block of MLA heads); every unit has the same
line of tiles: sequence by sequence, BLOCK_N tokens at a time (T tiles). Each unit's line is cut
into R even ranges, and program pid = j * UNITS + unit takes range j of its unit: every program
reads the same number of bytes whatever the mix of lengths, so a grid of the programs the GPU
holds at once ends together (no tail, no second wave). R is at most T / MIN_TILES (programs past it
idle), and for MLA a little less where that puts the range boundaries between sequences (ALIGN_TILES): a range never
comes out empty, and a short batch is merged from as few partials as it has
ranges. MIN_TILES > 1 where a partial is as large as the tiles it summarises (MLA: a 16-head block's
512-wide float32 partial is 32 KiB, a 32-token latent tile 36 KiB): one tile per range would write,
and merge back, as many bytes as it read.
Programs side by side take the same range of different units, so they read the same blocks at the
same time (all heads of a token row).
A range crosses whole sequences and cuts at most two: its first and its last. A whole sequence's
output is written directly; a cut one leaves a partial (output and log-sum-exp) in the program's
slot 0 (its first sequence) or 1 (its last, where that is not also its first: a range inside one
sequence writes its partial once), which combine_cut_units merges.
Every program sums seq_lens itself: no host sync.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .dispatch import launches_early, next_pow2, pdl_options, sm_count

# Integer arguments that change from step to step (how many sequences, the grid, an eager step's block-table width):
# specialized, each value equal to 1 or divisible by 16 would compile a variant inside a timed run. One variant each.
RUN_TIME_INTS = ["num_seqs", "num_programs", "stride_bt_seq"]
COMBINE_DIM_BLOCK = 64  # output columns per combine program: more programs, a small [rows, 64] tile
# Rows of a unit one combine program merges at most: 32 or 64 rows make a [J_BLOCK, rows, 64] float32 tile that spills.
COMBINE_MAX_ROWS = 16
# [J, rows, columns] a program loads a step at most (one tile, or J unrolled): 32 float32 a thread.
COMBINE_MAX_TILE = 4096
# Below this many combine programs a multiprocessor (a few sequences cut into hundreds of ranges), the rows, then the
# columns, are halved step by step down to ROW_SPLIT rows and DIM_SPLIT columns: one 64K MLA sequence's 396 partials
# merged in 8.6 us, not ~190 on 8 programs.
COMBINE_PROGRAMS_PER_SM = 1
COMBINE_ROW_SPLIT, COMBINE_DIM_SPLIT, COMBINE_J_SPLIT = 2, 32, 256
# Where a step takes its partials as one tile and the tile caps how many, columns are halved down to a 32-byte sector a
# row (each step is a round trip to memory): one 16-head 64K sequence's combine 8.6 -> 4.7 us.
COMBINE_DIM_LEAST = 8
# ... but only while the grid stays one wave: COMBINE_WAVE programs a multiprocessor (these tiles take 72-93 registers
# a thread: 5-7 fit). One 64-head sequence's 132 partials in one step of [256, 2, 8] took 2048 programs, 2.6 waves: in
# three steps of [64, 2, 32] on 512, its layer went 32.2 -> 25.1 us at 16K and 85.3 -> 80.4 at 128K on an H100; at
# 16 heads, 512 programs of one step stayed 0.5-0.8 us faster than 256 of two.
COMBINE_WAVE = 4
# Up to this many partials a step, each its own [rows, columns] tile, unrolled (few registers); above it, one
# [J, rows, columns] tile over the threads, which one long sequence's hundreds of partials need.
COMBINE_UNROLL_J = 16
# Where the step is such a tile, a sequence of fewer partials than this is merged in one unrolled step of this many
# slots instead (0: never): sized at launch for the most partials a sequence could have, the merge of a small layer's
# few paid for hundreds of masked ones. That step takes the larger blocks that fill the GPU (one program a block, the
# rest of the grid ends at once): 64 heads x 1K, 16 partials, left 2048 programs of [2, 8] in three waves of 7 a
# multiprocessor (72 registers); 256 of [2, 64] took the layer from 17.9 to 14.0 us on an H100.
COMBINE_FEW_J = 16
# Fewer than this many (one 64-head 4K sequence in one-tile ranges: 64), one [J, rows, columns] tile of this many
# partials, by one program of each block of rows and columns that fills it (one wave), not the whole grid's steps of
# J_SPLIT (2048 programs of [256, 2, 8] in three waves): 64h b1 x 4K 22.8 -> 18.1 us a layer on an H100.
COMBINE_MID_J = 64
# A range that straddles two sequences runs a second segment and leaves a partial in each. Where the sequences are of
# one length and fewer than the programs, R a multiple of them puts a boundary between every two: taken where the
# programs it leaves idle, (most - R) x T tiles, come to at most ALIGN_TILES tiles a range, i.e.
# (most - R) x T <= ALIGN_TILES x most^2 (most: R unaligned). MLA only (ALIGN: its query is 72 KiB, its partial 128 KiB
# at 64 heads): 128 heads x 32 sequences of 1K 1.12x faster.
ALIGN_TILES = tl.constexpr(2)


@triton.jit
def tile_line(seq_lens_ptr, num_seqs, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr):
    """Per sequence: length, tiles, and where its stretch of a unit's line ends; the line's length."""
    seqs = tl.arange(0, SEQS_PAD)
    lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    tiles = tl.cdiv(lens, BLOCK_N)
    return seqs, lens, tiles, tl.cumsum(tiles, 0), tl.sum(tiles, 0)


@triton.jit
def line_ranges(num_programs, UNITS: tl.constexpr, total, MIN_TILES: tl.constexpr, tiles, ALIGN: tl.constexpr,
                SHORT_LINE: tl.constexpr):
    """R: the programs per unit, but no more than the line's T tiles over MIN_TILES (at least 1; 1 on a line of at most
    SHORT_LINE percent of the programs); with ALIGN, fewer where the ranges then start at sequence boundaries
    (ALIGN_TILES). tiles: each sequence's."""
    per_unit = num_programs // UNITS
    least = tl.where(total * 100 <= per_unit * SHORT_LINE, 1, MIN_TILES)
    most = tl.maximum(1, tl.minimum(per_unit, total // least))
    if ALIGN:
        busy = tl.maximum(1, tl.sum((tiles > 0).to(tl.int32), 0))
        aligned = most // busy * busy
        most = tl.where((aligned > 0) & ((most - aligned) * total <= ALIGN_TILES * most * most), aligned, most)
    return most


@triton.jit
def program_start(j, ranges, total):
    """The first tile of range j <= R (R: the line's end)."""
    return (j.to(tl.int64) * total // ranges).to(tl.int32)


@triton.jit
def program_range(j, ranges, total):
    """Range j of R on a line of T tiles: [j*T//R, (j+1)*T//R); empty for j >= R."""
    return program_start(tl.minimum(j, ranges), ranges, total), program_start(tl.minimum(j + 1, ranges), ranges, total)


@triton.jit
def program_of(x, ranges, total):
    """The range holding tile x: the largest j with j*T//R <= x."""
    return (((x + 1).to(tl.int64) * ranges + total - 1) // total - 1).to(tl.int32)


@triton.jit
def locate(x, seqs, lens, tiles, ends):
    """Tile x of a unit's line -> (sequence, its first tile here, its tiles, its length, where it ends)."""
    seq = tl.sum((ends <= x).to(tl.int32), 0)
    here = seqs == seq
    n = tl.sum(tl.where(here, tiles, 0), 0)
    seq_end = tl.sum(tl.where(here, ends, 0), 0)
    return seq, x - (seq_end - n), n, tl.sum(tl.where(here, lens, 0), 0), seq_end


@triton.jit
def store_range_result(acc, m, l, out_ptr, seq, stride_o_seq, stride_o_head, heads, dims, out_mask, row_mask, rows,
                       part_out_ptr, part_lse_ptr, pid, whole, x, first, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """A sequence's attention over this range: its output if the range holds all of it, else a
    partial (output and log-sum-exp) in slot 0 if it is the range's first sequence (x == first), else in slot 1 (its
    last).
    Once, not in both slots, where the range lies inside the sequence: at 128 MLA heads a partial is 128 KiB, more
    than the 72 KiB latent tile it summarises."""
    if whole:
        o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
        tl.store(o_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        at = (pid * 2 + (x != first).to(tl.int32)) * ROWS + rows
        tl.store(part_out_ptr + at[:, None] * WIDTH + dims[None, :], acc / l[:, None], mask=out_mask)
        tl.store(part_lse_ptr + at, m + tl.log2(l), mask=row_mask)


@triton.jit
def _partial_at(j, j_first, first_slot, unit, rows, UNITS: tl.constexpr, ROWS: tl.constexpr):
    """Where program j's partial of a sequence is (rows of the unit): slot 1 of the first where its range began
    before the sequence, else slot 0."""
    slot = tl.where(j == j_first, first_slot, 0)
    return ((j * UNITS + unit) * 2 + slot) * ROWS + rows


@triton.jit
def _partial_lse(part_lse_ptr, j, j_first, j_last, first_slot, unit, rows, row_mask, UNITS: tl.constexpr,
                 ROWS: tl.constexpr):
    """Program j's log-sum-exp of the sequence's rows; -inf past the last program."""
    return tl.load(part_lse_ptr + _partial_at(j, j_first, first_slot, unit, rows, UNITS, ROWS),
                   mask=(j <= j_last) & row_mask, other=float("-inf"))


@triton.jit
def _merge_start(ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """A merge's running max, weight and output before any partial."""
    return (tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32),
            tl.zeros([ROWS, COLUMNS], tl.float32))


@triton.jit
def _store_merged(o_ptrs, acc, w, row_mask, mask):
    w = tl.where(row_mask, w, 1.0)
    tl.store(o_ptrs, (acc / w[:, None]).to(o_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _merge_unrolled(part_out_ptr, part_lse_ptr, m, w, acc, j0, j_first, j_last, first_slot, unit, rows, row_mask, dims,
                    mask, UNITS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, J: tl.constexpr):
    """Programs j0..j0+J-1's partials (those up to j_last) into the running (max, weight, output), each its own [rows,
    columns] tile, the sum over them in each thread: as one [J, rows, columns] tile Triton reduced it across warps
    through shared memory, at 193 registers a thread for 4 x 16 x 64 (2 programs a multiprocessor)."""
    m_new = m
    for jj in tl.static_range(J):
        m_new = tl.maximum(m_new, _partial_lse(part_lse_ptr, j0 + jj, j_first, j_last, first_slot, unit, rows,
                                               row_mask, UNITS, ROWS))
    m_new = tl.where(row_mask, m_new, 0.0)  # padding rows: no -inf - -inf
    alpha = tl.exp2(m - m_new)
    acc = acc * alpha[:, None]
    w = w * alpha
    for jj in tl.static_range(J):
        j = j0 + jj
        p = tl.exp2(_partial_lse(part_lse_ptr, j, j_first, j_last, first_slot, unit, rows, row_mask, UNITS, ROWS)
                    - m_new)
        at = _partial_at(j, j_first, first_slot, unit, rows, UNITS, ROWS)
        o = tl.load(part_out_ptr + at[:, None] * HEAD_DIM + dims[None, :], mask=(j <= j_last) & mask, other=0.0)
        acc += o * p[:, None]
        w += p
    return m_new, w, acc


@triton.jit
def _step_partials(part_out_ptr, part_lse_ptr, j0, j_first, j_last, first_slot, unit, rows, row_mask, dims,
                   UNITS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, J: tl.constexpr):
    """Programs j0..j0+J-1's log-sum-exps [J, rows] and outputs [J, rows, columns]: -inf and 0 past j_last."""
    js = j0 + tl.arange(0, J)
    at = _partial_at(js[:, None], j_first, first_slot, unit, rows[None, :], UNITS, ROWS)  # [J, rows]
    held = (js <= j_last)[:, None] & row_mask[None, :]
    lse = tl.load(part_lse_ptr + at, mask=held, other=float("-inf"))
    o = tl.load(part_out_ptr + at[:, :, None] * HEAD_DIM + dims[None, None, :],
                mask=held[:, :, None] & (dims < HEAD_DIM)[None, None, :], other=0.0)
    return lse, o


@triton.jit
def _merge_tile(part_out_ptr, part_lse_ptr, m, w, acc, j0, j_first, j_last, first_slot, unit, rows, row_mask, dims,
                UNITS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, J: tl.constexpr):
    """Programs j0..j0+J-1's partials (those up to j_last) into the running (max, weight, output) as one [J, rows,
    columns] tile spread over the threads."""
    lse, o = _step_partials(part_out_ptr, part_lse_ptr, j0, j_first, j_last, first_slot, unit, rows, row_mask, dims,
                            UNITS, ROWS, HEAD_DIM, J)
    m_new = tl.where(row_mask, tl.maximum(m, tl.max(lse, 0)), 0.0)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(lse - m_new[None, :])  # [J, rows]
    return m_new, w * alpha + tl.sum(p, 0), acc * alpha[:, None] + tl.sum(o * p[:, :, None], 0)


@triton.jit
def _merge_mid(part_out_ptr, part_lse_ptr, seq_out_ptr, stride_o_head, unit, row0, dim0, j_first, j_last, first_slot,
               NUM_HEADS: tl.constexpr, UNITS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
               MID_ROWS: tl.constexpr, MID_DIMS: tl.constexpr, MID_J: tl.constexpr):
    """A sequence's partials (fewer than MID_J), rows row0.. and columns dim0.. of the unit, as one tile."""
    rows = row0 + tl.arange(0, MID_ROWS)
    heads = unit * ROWS + rows
    row_mask = (rows < ROWS) & (heads < NUM_HEADS)
    dims = dim0 + tl.arange(0, MID_DIMS)
    m, w, acc = _merge_start(MID_ROWS, MID_DIMS)
    m, w, acc = _merge_tile(part_out_ptr, part_lse_ptr, m, w, acc, j_first, j_first, j_last, first_slot, unit, rows,
                            row_mask, dims, UNITS, ROWS, HEAD_DIM, MID_J)
    _store_merged(seq_out_ptr + heads[:, None] * stride_o_head + dims[None, :], acc, w, row_mask,
                  row_mask[:, None] & (dims < HEAD_DIM)[None, :])


@triton.jit
def _merge_few(part_out_ptr, part_lse_ptr, seq_out_ptr, stride_o_head, unit, row0, dim0, j_first, j_last, first_slot,
               NUM_HEADS: tl.constexpr, UNITS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
               FEW_ROWS: tl.constexpr, FEW_DIMS: tl.constexpr, FEW_J: tl.constexpr):
    """A sequence's few partials (up to FEW_J), rows row0.. and columns dim0.. of the unit, in one unrolled step."""
    rows = row0 + tl.arange(0, FEW_ROWS)
    heads = unit * ROWS + rows
    row_mask = (rows < ROWS) & (heads < NUM_HEADS)
    dims = dim0 + tl.arange(0, FEW_DIMS)
    mask = row_mask[:, None] & (dims < HEAD_DIM)[None, :]
    m, w, acc = _merge_start(FEW_ROWS, FEW_DIMS)
    m, w, acc = _merge_unrolled(part_out_ptr, part_lse_ptr, m, w, acc, j_first, j_first, j_last, first_slot, unit,
                                rows, row_mask, dims, mask, UNITS, ROWS, HEAD_DIM, FEW_J)
    _store_merged(seq_out_ptr + heads[:, None] * stride_o_head + dims[None, :], acc, w, row_mask, mask)


@triton.jit(do_not_specialize=RUN_TIME_INTS[:2])
def combine_cut_units(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, num_seqs, num_programs,
    stride_o_seq, stride_o_head,
    NUM_HEADS: tl.constexpr, UNITS: tl.constexpr, ROWS: tl.constexpr, ROW_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr,
    J_BLOCK: tl.constexpr, UNROLL: tl.constexpr, LANES: tl.constexpr, FEW_J: tl.constexpr, FEW_ROWS: tl.constexpr,
    FEW_DIMS: tl.constexpr,
    MID_J: tl.constexpr, MID_ROWS: tl.constexpr, MID_DIMS: tl.constexpr,
    MIN_TILES: tl.constexpr, SHORT_LINE: tl.constexpr, ALIGN: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (sequence, unit x row block, DIM_BLOCK columns). If range boundaries cut the sequence in this
    unit, merge the partials of the programs holding it (slot 1 of the first, slot 0 of the others), J_BLOCK
    programs' partials per step, into the output of ROW_BLOCK of the unit's ROWS heads. Whole ones were
    written already; empty sequences get zeros here."""
    seq = tl.program_id(0)
    row_blocks = tl.cdiv(ROWS, ROW_BLOCK)
    unit = tl.program_id(1) // row_blocks
    seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, SEQS_PAD)
    ranges = line_ranges(num_programs, UNITS, total, MIN_TILES, tiles, ALIGN, SHORT_LINE)
    n = tl.sum(tl.where(seqs == seq, tiles, 0), 0)
    seq_end = tl.sum(tl.where(seqs == seq, ends, 0), 0)
    j_first = program_of(seq_end - n, ranges, total)
    j_last = program_of(seq_end - 1, ranges, total)
    # a sequence of few partials in a grid sized for hundreds (FEW_J 0: none): one program of each FEW_ROWS x
    # FEW_DIMS block merges it; the others end here, before the wait, their slots free for it
    few = (n > 0) & (j_first != j_last) & (j_last - j_first < FEW_J)
    # likewise up to MID_J, as one tile (MID_J 1: none)
    mid = (n > 0) & (j_first != j_last) & (j_last - j_first >= FEW_J) & (j_last - j_first < MID_J)
    row_block = tl.program_id(1) % row_blocks
    leads = (row_block % (FEW_ROWS // ROW_BLOCK) == 0) & (tl.program_id(2) % (FEW_DIMS // DIM_BLOCK) == 0)
    leads_mid = (row_block % (MID_ROWS // ROW_BLOCK) == 0) & (tl.program_id(2) % (MID_DIMS // DIM_BLOCK) == 0)
    if (few & ~leads) | (mid & ~leads_mid):
        return
    # launched early (dispatch.launches_early): the attention kernel's partials and outputs are complete past this
    if PDL:
        gdc_wait()
    rows = row_block * ROW_BLOCK + tl.arange(0, ROW_BLOCK)
    heads = unit * ROWS + rows
    row_mask = (rows < ROWS) & (heads < NUM_HEADS)
    dims = tl.program_id(2) * DIM_BLOCK + tl.arange(0, DIM_BLOCK)
    mask = row_mask[:, None] & (dims < HEAD_DIM)[None, :]
    o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
    if n == 0:
        tl.store(o_ptrs, tl.zeros([ROW_BLOCK, DIM_BLOCK], tl.float32).to(out_ptr.dtype.element_ty), mask=mask)
    elif few:
        first_slot = (program_start(j_first, ranges, total) < seq_end - n).to(tl.int32)
        _merge_few(part_out_ptr, part_lse_ptr, out_ptr + seq * stride_o_seq, stride_o_head, unit, row_block * ROW_BLOCK,
                   tl.program_id(2) * DIM_BLOCK, j_first, j_last, first_slot, NUM_HEADS, UNITS, ROWS, HEAD_DIM,
                   FEW_ROWS, FEW_DIMS, FEW_J)
    elif mid:
        first_slot = (program_start(j_first, ranges, total) < seq_end - n).to(tl.int32)
        _merge_mid(part_out_ptr, part_lse_ptr, out_ptr + seq * stride_o_seq, stride_o_head, unit, row_block * ROW_BLOCK,
                   tl.program_id(2) * DIM_BLOCK, j_first, j_last, first_slot, NUM_HEADS, UNITS, ROWS, HEAD_DIM,
                   MID_ROWS, MID_DIMS, MID_J)
    else:
        if j_first != j_last:
            # the first program holds it in slot 1 where its range began before the sequence, else in slot 0
            first_slot = (program_start(j_first, ranges, total) < seq_end - n).to(tl.int32)
            # each way its own running (max, weight, output) and store: values that meet after an `if` share one
            # layout, and the tiles' reduced layout forced on the unrolled path's loads cost 168 registers, not 80
            if UNROLL:
                m, w, acc = _merge_start(ROW_BLOCK, DIM_BLOCK)
                for j0 in range(j_first, j_last + 1, J_BLOCK):
                    m, w, acc = _merge_unrolled(part_out_ptr, part_lse_ptr, m, w, acc, j0, j_first, j_last,
                                                first_slot, unit, rows, row_mask, dims, mask, UNITS, ROWS, HEAD_DIM,
                                                J_BLOCK)
                _store_merged(o_ptrs, acc, w, row_mask, mask)
            elif LANES:
                # more steps than one: each of a step's J lanes keeps its own running (max, weight, output) across
                # the steps, so a step is element-wise in each thread, and the lanes are reduced across the warps
                # once, after the last step (that reduction was half of a 64-head 128K sequence's merge each step:
                # shared-memory stores, barriers and shuffles)
                lane_m = tl.full([J_BLOCK, ROW_BLOCK], float("-inf"), tl.float32)
                lane_w = tl.zeros([J_BLOCK, ROW_BLOCK], tl.float32)
                lane_acc = tl.zeros([J_BLOCK, ROW_BLOCK, DIM_BLOCK], tl.float32)
                for j0 in range(j_first, j_last + 1, J_BLOCK):
                    lse, o = _step_partials(part_out_ptr, part_lse_ptr, j0, j_first, j_last, first_slot, unit, rows,
                                            row_mask, dims, UNITS, ROWS, HEAD_DIM, J_BLOCK)
                    m_new = tl.maximum(lane_m, lse)
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane with nothing yet: no -inf - -inf
                    alpha = tl.exp2(lane_m - m_safe)
                    p = tl.exp2(lse - m_safe)
                    lane_acc = lane_acc * alpha[:, :, None] + o * p[:, :, None]
                    lane_w = lane_w * alpha + p
                    lane_m = m_new
                m = tl.where(row_mask, tl.max(lane_m, 0), 0.0)  # padding rows: no -inf - -inf
                scale = tl.exp2(lane_m - m[None, :])  # [J, rows]; 0 for a lane that held no partial
                _store_merged(o_ptrs, tl.sum(lane_acc * scale[:, :, None], 0), tl.sum(lane_w * scale, 0), row_mask,
                              mask)
            else:
                m, w, acc = _merge_start(ROW_BLOCK, DIM_BLOCK)
                for j0 in range(j_first, j_last + 1, J_BLOCK):
                    # many partials a step (few sequences cut into many ranges): spread over the threads. _merge_tile's
                    # update, written out: called here, ptxas scheduled the loop otherwise (91 registers, not 72-80),
                    # and one 16K-64K sequence's layer took 1.1-2.5 us longer on an H100
                    lse, o = _step_partials(part_out_ptr, part_lse_ptr, j0, j_first, j_last, first_slot, unit, rows,
                                            row_mask, dims, UNITS, ROWS, HEAD_DIM, J_BLOCK)
                    m_new = tl.where(row_mask, tl.maximum(m, tl.max(lse, 0)), 0.0)
                    alpha = tl.exp2(m - m_new)
                    p = tl.exp2(lse - m_new[None, :])  # [J, rows]
                    acc = acc * alpha[:, None] + tl.sum(o * p[:, :, None], 0)
                    w = w * alpha + tl.sum(p, 0)
                    m = m_new
                _store_merged(o_ptrs, acc, w, row_mask, mask)


def fit_tile(rows, dims, j, least_rows, least_dims):
    """A block of rows x columns whose J partials make at most a COMBINE_MAX_TILE tile: the columns halved first, then
    the rows, no smaller than the step's own block."""
    while rows * dims * j > COMBINE_MAX_TILE and dims > least_dims:
        dims //= 2
    while rows * dims * j > COMBINE_MAX_TILE and rows > least_rows:
        rows //= 2
    return rows, dims


def merge_partials(part_out, part_lse, seq_lens, out, num_programs, *, num_heads, units, rows, head_dim, block_n,
                   min_tiles=1, short_line=0, align=False):
    """Launch combine_cut_units over every (sequence, unit, row block, column block), in smaller blocks where that
    grid would leave the GPU mostly idle (few sequences), merging more partials a step where a sequence has many."""
    num_seqs = seq_lens.shape[0]
    # The blocks are chosen for the batch rounded up to a power of two: the constexprs (hence the compiled variants)
    # of a batch between two of the paged stack's CUDA-graph buckets are those of a bucket, warmed before the timed
    # run (memcheck/stacks/paged/graphs.py). An eager mixed step decodes any count of sequences (R1's 32 x 2K: 1 to 31).
    seqs = next_pow2(num_seqs)
    # the lengths summed over 16 lanes at least: the sum does not depend on the width, and a wider one cost each launch
    # ~1 us (decode's 64 lanes)
    seqs_pad = max(16, seqs)
    row_block = min(max(2, next_pow2(rows)), COMBINE_MAX_ROWS)  # ROW_BLOCK 1 would be a different tl.arange
    dim_block = min(COMBINE_DIM_BLOCK, max(16, next_pow2(head_dim)))

    def programs():
        return seqs * units * triton.cdiv(rows, row_block) * triton.cdiv(head_dim, dim_block)

    while programs() < COMBINE_PROGRAMS_PER_SM * sm_count(out.device):
        if row_block > COMBINE_ROW_SPLIT:
            row_block //= 2
        elif dim_block > COMBINE_DIM_SPLIT:
            dim_block //= 2
        else:
            break
    few_rows, few_dims = row_block, dim_block  # a sequence of few partials: the blocks that fill the GPU, unrolled
    # partials a step: about as many as a sequence has, were the lengths equal (its share of the unit's ranges, + 1
    # for the cuts), so few are masked; a power of two from 2 to J_SPLIT, 8 variants to compile at most
    wanted = min(max(2, next_pow2(num_programs // (units * seqs) + 1)), COMBINE_J_SPLIT)

    def j_block():
        return min(wanted, max(1, COMBINE_MAX_TILE // (row_block * dim_block)))

    while (COMBINE_UNROLL_J < j_block() < wanted and dim_block > COMBINE_DIM_LEAST
           and 2 * programs() <= COMBINE_WAVE * sm_count(out.device)):
        dim_block //= 2
    # bf16 partials (the seesaw's): twice the columns, the same bytes a program, where that leaves two programs a
    # multiprocessor and a step half a sequence's partials (128h x 256 sequences of 1K: 1.06x faster)
    if (part_out.element_size() == 2 and dim_block == COMBINE_DIM_BLOCK < head_dim
            and programs() >= 4 * sm_count(out.device)
            and min(wanted, COMBINE_MAX_TILE // (row_block * 2 * dim_block)) >= wanted // 2):
        dim_block *= 2
    j_block = j_block()
    unroll = j_block <= COMBINE_UNROLL_J
    # a sequence merged in more steps than one keeps a running state a lane: on an H100, 64h one sequence of 128K
    # (three steps) 77.9 -> 75.4 us a layer, 32h of 64K (two) 47.3 -> 46.0; in one step (16h of 128K, dense GQA
    # of 32K and 128K) it was 0.3-0.7 us slower, there the reduction is once either way
    lanes = not unroll and j_block < wanted
    few_rows, few_dims = fit_tile(max(few_rows, row_block), max(few_dims, dim_block), COMBINE_FEW_J, row_block,
                                  dim_block)
    mid_rows, mid_dims = fit_tile(few_rows, few_dims, COMBINE_MID_J, row_block, dim_block)
    combine_cut_units[(num_seqs, units * triton.cdiv(rows, row_block), triton.cdiv(head_dim, dim_block))](
        part_out, part_lse, seq_lens, out, num_seqs, num_programs, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, UNITS=units, ROWS=rows, ROW_BLOCK=row_block,
        HEAD_DIM=head_dim, DIM_BLOCK=dim_block, BLOCK_N=block_n, SEQS_PAD=seqs_pad, J_BLOCK=j_block,
        UNROLL=unroll, LANES=lanes, FEW_J=0 if unroll else COMBINE_FEW_J, FEW_ROWS=few_rows, FEW_DIMS=few_dims,
        MID_J=1 if unroll else COMBINE_MID_J, MID_ROWS=mid_rows, MID_DIMS=mid_dims,
        MIN_TILES=min_tiles, SHORT_LINE=short_line, ALIGN=align,
        **pdl_options(launches_early(out.device)),
        num_warps=4,
    )
