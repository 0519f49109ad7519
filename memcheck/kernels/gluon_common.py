"""What the Gluon kernels (mla_seesaw.py, mla_narrow.py, prefill_hopper.py) share: Triton helpers they cannot call
(Gluon cannot call Triton's jit functions), in Gluon's explicit layouts. work_split.py's tile line (every sequence's
tiles end to end, cut into one range a program) and its partials' slots; cp.async copies arriving on a barrier; PDL's
wait; stamps.py's time stamps."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .stamps import SLOTS
from .work_split import ALIGN_TILES


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _range_start(j, ranges, total):
    return (j.to(gl.int64) * total // ranges).to(gl.int32)


@gluon.jit
def program_range(seq_lens_ptr, num_seqs, num_programs, NUM_HEAD_BLOCKS: gl.constexpr, MIN_TILES: gl.constexpr,
                  SHORT_LINE: gl.constexpr, TILE: gl.constexpr, SEQS_PAD: gl.constexpr, line: gl.constexpr):
    """This program's head block and its range [first, last) of the tile line (every sequence's tiles end to end),
    with the line per sequence: index, length, tiles, and where its tiles end."""
    pid = gl.program_id(0)
    seqs = gl.arange(0, SEQS_PAD, line)
    lens = gl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    tiles = (lens + TILE - 1) // TILE
    ends = gl.associative_scan(tiles, 0, _add)
    total = gl.sum(tiles, 0)
    per_unit = num_programs // NUM_HEAD_BLOCKS  # work_split.line_ranges, ALIGN
    least = gl.where(total * 100 <= per_unit * SHORT_LINE, 1, MIN_TILES)
    most = gl.maximum(1, gl.minimum(per_unit, total // least))
    busy = gl.maximum(1, gl.sum((tiles > 0).to(gl.int32), 0))
    aligned = most // busy * busy
    ranges = gl.where((aligned > 0) & ((most - aligned) * total <= ALIGN_TILES * most * most), aligned, most)
    j = pid // NUM_HEAD_BLOCKS
    first = _range_start(gl.minimum(j, ranges), ranges, total)
    last = _range_start(gl.minimum(j + 1, ranges), ranges, total)
    return pid % NUM_HEAD_BLOCKS, first, last, seqs, lens, tiles, ends


@gluon.jit
def segment(x, last, seqs, lens, tiles, ends, TILE: gl.constexpr):
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
def tile_blocks(bt_row, t0, end, toks, BLOCK_SIZE: gl.constexpr):
    """The cache block of each token t0.. of a sequence (0 past `end`): loaded a tile ahead of its copy, so the copy
    does not wait on the block table."""
    tok = t0 + toks
    return gl.load(bt_row + tok // BLOCK_SIZE, mask=tok < end, other=0).to(gl.int64)


@gluon.jit
def partial_row(x, first, PART_ROWS: gl.constexpr):
    """The first row of this program's partial of the sequence starting at tile x: slot 0 for the range's first
    sequence, 1 for its last (work_split's layout, which combine_cut_units reads)."""
    return (gl.program_id(0) * 2 + (x != first).to(gl.int32)) * PART_ROWS


@gluon.jit
def gdc_wait_gluon():
    """Triton's gdc_wait in Gluon: past this, the kernel before this one (PDL: dispatch.pdl_options) has finished
    and its writes are visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gdc_launch_dependents_gluon():
    """PDL: the kernel after this one (launched with programmatic dependent launch) may start its programs once every
    program of this one has passed here or exited; they still wait in gdc_wait for this one's end and writes."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def stamp_gluon(stamps_ptr, row, SLOT: gl.constexpr, WIDTH: gl.constexpr = SLOTS, SM: gl.constexpr = False):
    """memcheck/kernels/stamps.py's stamp, in Gluon (rows of WIDTH slots); SM: the multiprocessor too, in the row's last slot."""
    now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(stamps_ptr + row * WIDTH + SLOT, now)
    if SM:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.store(stamps_ptr + row * WIDTH + WIDTH - 1, sm.to(gl.int64))


@gluon.jit
def arrive_when_copied(ready, TMA: gl.constexpr):
    """Each thread's cp.async copies arrive on `ready` as they land. TMA: `ready` counts one arrival (a buffer's TMA
    copies share it), each thread's copies holding its phase open until they land; else it counts every thread."""
    if TMA:
        cp.mbarrier_arrive(ready)
        gl.thread_barrier()
        mbarrier.arrive(ready, count=1)
    else:
        cp.mbarrier_arrive(ready, increment_count=False)
