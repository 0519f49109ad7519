"""Even split of decode work over a one-wave grid (split-context / flash-decoding, balanced).

A unit of work is one head group (a KV head, or a block of MLA heads); every unit has the same
line of tiles: sequence by sequence, BLOCK_N tokens at a time (T tiles). Each unit's line is cut
into R even ranges, and program pid = j * UNITS + unit takes range j of its unit: every program
reads the same number of bytes whatever the mix of lengths, so a grid of the programs the GPU
holds at once ends together (no tail, no second wave). Programs side by side take the same range
of different units, so they read the same blocks at the same time (all heads of a token row).
A range crosses whole sequences and cuts at most two: its first and its last. A whole sequence's
output is written directly; a cut one leaves a partial (output and log-sum-exp) in the program's
slot 0 (its first sequence) or 1 (its last), which combine_cut_units merges.
Every program sums seq_lens itself: no host sync.
"""
import triton
import triton.language as tl


@triton.jit
def tile_line(seq_lens_ptr, num_seqs, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr):
    """Per sequence: length, tiles, and where its stretch of a unit's line ends; the line's length."""
    seqs = tl.arange(0, SEQS_PAD)
    lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    tiles = tl.cdiv(lens, BLOCK_N)
    return seqs, lens, tiles, tl.cumsum(tiles, 0), tl.sum(tiles, 0)


@triton.jit
def program_range(j, ranges, total):
    """Range j of R on a line of T tiles: [j*T//R, (j+1)*T//R)."""
    j = tl.cast(j, tl.int64)
    first = (j * total // ranges).to(tl.int32)
    last = ((j + 1) * total // ranges).to(tl.int32)
    return first, last


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
                       part_out_ptr, part_lse_ptr, pid, whole, x, first, seg_end, last,
                       ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """A sequence's attention over this range: its output if the range holds all of it, else a
    partial (output and log-sum-exp) in slot 0 if it is the range's first sequence, 1 if its last."""
    if whole:
        o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
        tl.store(o_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = acc / l[:, None]
        lse = m + tl.log2(l)
        for slot in tl.static_range(2):
            if ((slot == 0) & (x == first)) | ((slot == 1) & (seg_end == last)):
                at = (pid * 2 + slot) * ROWS + rows
                tl.store(part_out_ptr + at[:, None] * WIDTH + dims[None, :], part, mask=out_mask)
                tl.store(part_lse_ptr + at, lse, mask=row_mask)


@triton.jit
def combine_cut_units(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, num_seqs, num_programs,
    stride_o_seq, stride_o_head,
    NUM_HEADS: tl.constexpr, UNITS: tl.constexpr, ROWS: tl.constexpr, ROWS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr,
):
    """Grid (sequence, unit). If range boundaries cut the sequence in this unit, merge the partials
    of the programs holding it (slot 1 of the first, slot 0 of the others) into the output rows of
    the unit's ROWS heads. Whole ones were written already; empty sequences get zeros here."""
    seq = tl.program_id(0)
    unit = tl.program_id(1)
    ranges = num_programs // UNITS
    seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, SEQS_PAD)
    n = tl.sum(tl.where(seqs == seq, tiles, 0), 0)
    rows = tl.arange(0, ROWS_PAD)
    heads = unit * ROWS + rows
    row_mask = (rows < ROWS) & (heads < NUM_HEADS)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = row_mask[:, None] & (dims < HEAD_DIM)[None, :]
    o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
    if n == 0:
        tl.store(o_ptrs, tl.zeros([ROWS_PAD, HEAD_DIM_PAD], tl.float32).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        seq_end = tl.sum(tl.where(seqs == seq, ends, 0), 0)
        j_first = program_of(seq_end - n, ranges, total)
        j_last = program_of(seq_end - 1, ranges, total)
        if j_first != j_last:
            at = ((j_first * UNITS + unit) * 2 + 1) * ROWS + rows
            m = tl.load(part_lse_ptr + at, mask=row_mask, other=0.0)
            acc = tl.load(part_out_ptr + at[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
            w = tl.full([ROWS_PAD], 1.0, tl.float32)
            for j in range(j_first + 1, j_last + 1):
                j_start, j_end = program_range(j, ranges, total)
                at = ((j * UNITS + unit) * 2) * ROWS + rows
                # an empty range (more programs than tiles) left nothing: weigh it 0
                lse = tl.load(part_lse_ptr + at, mask=row_mask & (j_end > j_start), other=float("-inf"))
                o = tl.load(part_out_ptr + at[:, None] * HEAD_DIM + dims[None, :], mask=mask & (j_end > j_start),
                            other=0.0)
                m_new = tl.maximum(m, lse)
                acc = acc * tl.exp2(m - m_new)[:, None] + o * tl.exp2(lse - m_new)[:, None]
                w = w * tl.exp2(m - m_new) + tl.exp2(lse - m_new)
                m = m_new
            tl.store(o_ptrs, (acc / w[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
