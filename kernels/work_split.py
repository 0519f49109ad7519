"""Even split of decode work over a one-wave grid (split-context / flash-decoding, balanced).

A unit of work is one head group (a KV head, or a block of MLA heads); every unit has the same
line of tiles: sequence by sequence, BLOCK_N tokens at a time (T tiles). Each unit's line is cut
into R even ranges, and program pid = j * UNITS + unit takes range j of its unit: every program
reads the same number of bytes whatever the mix of lengths, so a grid of the programs the GPU
holds at once ends together (no tail, no second wave). R is at most T / MIN_TILES (programs past it
idle): a range never comes out empty, and a short batch is merged from as few partials as it has
ranges. MIN_TILES > 1 where a partial is as large as the tiles it summarises (MLA: a 16-head block's
512-wide float32 partial is 32 KiB, a 32-token latent tile 36 KiB): one tile per range would write,
and merge back, as many bytes as it read.
Programs side by side take the same range of different units, so they read the same blocks at the
same time (all heads of a token row).
A range crosses whole sequences and cuts at most two: its first and its last. A whole sequence's
output is written directly; a cut one leaves a partial (output and log-sum-exp) in the program's
slot 0 (its first sequence) or 1 (its last) and takes a ticket (kernels/tickets.py, one per sequence
and unit) after its range: the program that draws the last, whichever finishes last, merges that
sequence's partials into its output, in the same launch. Empty sequences get zeros from program
j = seq mod P (P programs per unit).
Every program sums seq_lens itself: no host sync.

Why the merging program sees every partial (the pattern of kernels/skinny_gemm.py's split-K): each
program stores its partial, then tl.debug_barrier() (bar.sync: all its threads' stores are ordered
before what follows), then one atomic add with acq_rel semantics at GPU scope: the release makes the
partial visible to whoever acquires the counter later. The program whose add returns count - 1
acquired every other program's release; a second barrier orders its threads after that acquire, and
its loads of the partials use .cg (cached in L2 only, where the other multiprocessors' stores are,
never a stale L1 line). It then puts the counter back to 0: the launch ends with every counter
zeroed, ready for the next one or a CUDA graph replay. No program waits for another: no deadlock,
whatever the order the programs run in.
"""
import triton
import triton.language as tl


MERGE_J_BLOCK = tl.constexpr(8)  # partials merged per step


@triton.jit
def tile_line(seq_lens_ptr, num_seqs, BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr):
    """Per sequence: length, tiles, and where its stretch of a unit's line ends; the line's length."""
    seqs = tl.arange(0, SEQS_PAD)
    lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    tiles = tl.cdiv(lens, BLOCK_N)
    return seqs, lens, tiles, tl.cumsum(tiles, 0), tl.sum(tiles, 0)


@triton.jit
def line_ranges(num_programs, UNITS: tl.constexpr, total, MIN_TILES: tl.constexpr):
    """R: the programs per unit, but no more than the line's T tiles over MIN_TILES (at least 1)."""
    return tl.maximum(1, tl.minimum(num_programs // UNITS, total // MIN_TILES))


@triton.jit
def program_range(j, ranges, total):
    """Range j of R on a line of T tiles: [j*T//R, (j+1)*T//R); empty for j >= R."""
    j = tl.cast(tl.minimum(j, ranges), tl.int64)
    first = (j * total // ranges).to(tl.int32)
    last = (tl.minimum(j + 1, ranges) * total // ranges).to(tl.int32)
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
    partial (output and log-sum-exp) in slot 0 if it is the range's first sequence, 1 if its last
    (merge_cut_sequences takes its ticket after the range)."""
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


@triton.jit(noinline=True)
def merge_cut_sequences(first, last, seq_lens_ptr, num_seqs, num_programs, part_out_ptr, part_lse_ptr, ticket_ptr,
                        out_ptr, stride_o_seq, stride_o_head, unit, valid_rows,
                        UNITS: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr, MIN_TILES: tl.constexpr,
                        BLOCK_N: tl.constexpr, SEQS_PAD: tl.constexpr):
    """Called by every program after its range [first, last) of the unit's line: a ticket for each cut sequence it
    left a partial of (at most two: the range's first and last sequence); drawing a sequence's last ticket, it
    merges the partials into the output rows of the unit's valid_rows heads and puts the counter back to 0 for the
    next launch or CUDA graph replay.
    A function of its own (noinline: scalar arguments, the line recomputed from seq_lens). Inlined after the tile
    loop, it cost registers there (sm_90, Triton 3.6's ptxas): GQA decode 162 -> ~200 registers, 2 programs per
    multiprocessor instead of 3; the MLA tile loop, at its 168-register cap, 17 local loads and 6 stores per tile
    against 2 and 0. As a call: 168 registers (3 programs), and 14 and 3."""
    if first < last:
        seqs, lens, tiles, ends, total = tile_line(seq_lens_ptr, num_seqs, BLOCK_N, SEQS_PAD)
        ranges = line_ranges(num_programs, UNITS, total, MIN_TILES)
        first_seq = tl.sum((ends <= first).to(tl.int32), 0)
        for k in range(2):
            seq, _, n, _, seq_end = locate(tl.where(k == 0, first, last - 1), seqs, lens, tiles, ends)
            j_first = program_of(seq_end - n, ranges, total)
            j_last = program_of(seq_end - 1, ranges, total)
            if (j_first != j_last) & ((k == 0) | (seq != first_seq)):  # cut, and not counted twice
                ticket = ticket_ptr + seq * UNITS + unit
                tl.debug_barrier()  # every thread's partial stored before the ticket releases them
                if tl.atomic_add(ticket, 1) == j_last - j_first:  # acq_rel: the other programs' partials are visible
                    tl.debug_barrier()  # every thread after that acquire (made by one thread)
                    o_ptr = out_ptr + seq * stride_o_seq + unit * ROWS * stride_o_head
                    merge_cut_sequence(part_out_ptr, part_lse_ptr, o_ptr, stride_o_head, unit, j_first, j_last,
                                       valid_rows, UNITS, ROWS, WIDTH)
                    tl.store(ticket, 0)


@triton.constexpr_function
def merge_rows(rows):
    """Rows a merge step takes: the unit's, to a power of two (not the tensor cores' 16: registers)."""
    return max(2, triton.next_power_of_2(rows))


@triton.constexpr_function
def merge_columns(width):
    """Output columns a merge step takes (at most 64): a small [MERGE_J_BLOCK, rows, columns] float32 tile."""
    return min(64, max(16, triton.next_power_of_2(width)))


@triton.jit
def merge_cut_sequence(part_out_ptr, part_lse_ptr, o_ptr, stride_o_head, unit, j_first, j_last, valid_rows,
                       UNITS: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """The output (o_ptr: its row of the unit's first head) of a sequence that range boundaries cut in this unit:
    the partials of the programs holding it (slot 1 of the first, slot 0 of the others) merged by their
    log-sum-exp, MERGE_J_BLOCK programs' partials of a few columns per step, for the unit's first valid_rows rows.
    The loads bypass L1 (.cg): other multiprocessors stored those partials."""
    ROWS_PAD: tl.constexpr = merge_rows(ROWS)
    DIM_BLOCK: tl.constexpr = merge_columns(WIDTH)
    J_BLOCK: tl.constexpr = MERGE_J_BLOCK
    rows = tl.arange(0, ROWS_PAD)
    row_mask = rows < valid_rows
    for d0 in range(0, WIDTH, DIM_BLOCK):
        dims = d0 + tl.arange(0, DIM_BLOCK)
        m = tl.full([ROWS_PAD], float("-inf"), tl.float32)
        w = tl.zeros([ROWS_PAD], tl.float32)
        acc = tl.zeros([ROWS_PAD, DIM_BLOCK], tl.float32)
        for j0 in range(j_first, j_last + 1, J_BLOCK):
            js = j0 + tl.arange(0, J_BLOCK)
            slot = (js == j_first).to(tl.int32)  # the first program holds the sequence's start in slot 1
            at = ((js * UNITS + unit) * 2 + slot)[:, None] * ROWS + rows[None, :]  # [J, rows]
            held = (js <= j_last)[:, None] & row_mask[None, :]
            lse = tl.load(part_lse_ptr + at, mask=held, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(part_out_ptr + at[:, :, None] * WIDTH + dims[None, None, :],
                        mask=held[:, :, None] & (dims < WIDTH)[None, None, :], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse, 0))
            m_new = tl.where(row_mask, m_new, 0.0)  # padding rows: no -inf - -inf
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(lse - m_new[None, :])  # [J, rows]
            acc = acc * alpha[:, None] + tl.sum(o * p[:, :, None], 0)
            w = w * alpha + tl.sum(p, 0)
            m = m_new
        w = tl.where(row_mask, w, 1.0)
        tl.store(o_ptr + rows[:, None] * stride_o_head + dims[None, :], (acc / w[:, None]).to(o_ptr.dtype.element_ty),
                 mask=row_mask[:, None] & (dims < WIDTH)[None, :])


@triton.jit
def zero_empty_sequences(seq_lens_ptr, num_seqs, j, programs_per_unit, out_ptr, stride_o_seq, stride_o_head, heads,
                         dims, out_mask):
    """Sequences with nothing cached (a CUDA graph's padding rows) get zeros in this unit's rows: program j of the
    unit writes sequences j, j + P, j + 2P ... of its P."""
    for s in range(j, num_seqs, programs_per_unit):
        if tl.load(seq_lens_ptr + s) == 0:
            tl.store(out_ptr + s * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :],
                     tl.zeros(out_mask.shape, out_ptr.dtype.element_ty), mask=out_mask)

