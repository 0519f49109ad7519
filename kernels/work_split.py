"""Even split of decode work over a one-wave grid (split-context / flash-decoding, balanced).

All the work of a decode step is a line of tiles: sequence by sequence, within it head group by
head group (a KV head, or a block of MLA heads), within it BLOCK_N tokens at a time. Program p of
G takes tiles [p*T//G, (p+1)*T//G): every program reads the same number of bytes whatever the
mix of lengths, so a grid of exactly the resident programs ends together (no tail, no second
wave). A program's range crosses whole (sequence, group) units and cuts at most two: its first
and its last. A whole unit's output is written directly; a cut one leaves a partial (output and
log-sum-exp) in the program's slot 0 (first unit) or 1 (last unit), combined afterwards.
The split needs the tile counts, so every program sums seq_lens itself: no host sync.
"""
import triton
import triton.language as tl


@triton.jit
def tile_line(seq_lens_ptr, num_seqs, BLOCK_N: tl.constexpr, UNITS: tl.constexpr, SEQS_PAD: tl.constexpr):
    """Per sequence: length, tiles per unit, and the end of its stretch of the line; the total."""
    seqs = tl.arange(0, SEQS_PAD)
    lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    tiles = tl.cdiv(lens, BLOCK_N)
    ends = tl.cumsum(tiles * UNITS, 0)
    return seqs, lens, tiles, ends, tl.sum(tiles * UNITS, 0)


@triton.jit
def program_range(pid, num_programs, total):
    pid = tl.cast(pid, tl.int64)
    first = (pid * total // num_programs).to(tl.int32)
    last = ((pid + 1) * total // num_programs).to(tl.int32)
    return first, last


@triton.jit
def program_of(x, num_programs, total):
    """The program whose range holds tile x: the largest p with p*T//G <= x."""
    return (((x + 1).to(tl.int64) * num_programs + total - 1) // total - 1).to(tl.int32)


@triton.jit
def locate(x, seqs, lens, tiles, ends, UNITS: tl.constexpr):
    """Tile x -> (sequence, unit, first tile within the unit, tiles per unit, sequence length,
    the line position where the unit ends)."""
    seq = tl.sum((ends <= x).to(tl.int32), 0)
    here = seqs == seq
    n = tl.sum(tl.where(here, tiles, 0), 0)
    seq_len = tl.sum(tl.where(here, lens, 0), 0)
    seq_start = tl.sum(tl.where(here, ends, 0), 0) - n * UNITS
    unit = (x - seq_start) // n
    t_first = x - seq_start - unit * n
    return seq, unit, t_first, n, seq_len, seq_start + (unit + 1) * n


@triton.jit
def combine_cut_units(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, num_seqs, num_programs,
    stride_o_seq, stride_o_head,
    NUM_HEADS: tl.constexpr, UNITS: tl.constexpr, ROWS: tl.constexpr, ROWS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr,
):
    """Grid (sequence, unit). If program boundaries cut the unit, merge its programs' partials
    (slot 1 of the first program, slot 0 of the others) into the output rows of its ROWS heads.
    Whole units were written already; empty sequences get zeros here."""
    seq = tl.program_id(0)
    unit = tl.program_id(1)
    seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, UNITS, SEQS_PAD)
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
        unit_first = tl.sum(tl.where(seqs == seq, ends, 0), 0) - (UNITS - unit) * n
        p_first = program_of(unit_first, num_programs, total)
        p_last = program_of(unit_first + n - 1, num_programs, total)
        if p_first != p_last:
            at = (p_first * 2 + 1) * ROWS + rows
            m = tl.load(part_lse_ptr + at, mask=row_mask, other=0.0)
            acc = tl.load(part_out_ptr + at[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
            w = tl.full([ROWS_PAD], 1.0, tl.float32)
            for p in range(p_first + 1, p_last + 1):
                p_start, p_end = program_range(p, num_programs, total)
                at = (p * 2) * ROWS + rows
                # an empty range (more programs than tiles) left nothing: weigh it 0
                lse = tl.load(part_lse_ptr + at, mask=row_mask & (p_end > p_start), other=float("-inf"))
                o = tl.load(part_out_ptr + at[:, None] * HEAD_DIM + dims[None, :], mask=mask & (p_end > p_start),
                            other=0.0)
                m_new = tl.maximum(m, lse)
                acc = acc * tl.exp2(m - m_new)[:, None] + o * tl.exp2(lse - m_new)[:, None]
                w = w * tl.exp2(m - m_new) + tl.exp2(lse - m_new)
                m = m_new
            tl.store(o_ptrs, (acc / w[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
