"""How many ranges work_split.line_ranges cuts a unit's tile line into, run under the interpreter on the H200's grids:
for MLA (ALIGN) a little fewer than the programs where the range boundaries then fall between sequences of one
length, and never so many fewer that long ranges lose more programs than a straddled boundary costs; dense decode
every program."""
import functools

import pytest
import torch

triton = pytest.importorskip("triton")
tl = triton.language

from memcheck.kernels import work_split  # noqa: E402


@functools.cache
def _ranges():
    """The probe kernel, made under the interpreter (the autouse fixture's TRITON_INTERPRET, read at definition)."""
    @triton.jit
    def probe(seq_lens_ptr, out_ptr, num_seqs, num_programs, UNITS: tl.constexpr, BLOCK_N: tl.constexpr,
              SEQS_PAD: tl.constexpr, MIN_TILES: tl.constexpr, ALIGN: tl.constexpr, SHORT_LINE: tl.constexpr):
        seqs, lens, tiles, ends, total = work_split.tile_line(seq_lens_ptr, num_seqs, BLOCK_N, SEQS_PAD)
        tl.store(out_ptr, work_split.line_ranges(num_programs, UNITS, total, MIN_TILES, tiles, ALIGN, SHORT_LINE))
    return probe


def ranges(lengths, programs, units, min_tiles=2, align=True, short_line=0):
    out = torch.zeros(1, dtype=torch.int32)
    pad = max(16, 1 << (len(lengths) - 1).bit_length())
    _ranges()[(1,)](torch.tensor(lengths, dtype=torch.int32), out, len(lengths), programs, UNITS=units, BLOCK_N=64,
                  SEQS_PAD=pad, MIN_TILES=min_tiles, ALIGN=align, SHORT_LINE=short_line)
    return int(out)


@pytest.mark.parametrize("lengths, programs, units, expected", [
    ([32768], 132, 2, 66),  # one sequence: every program (128 MLA heads: 2 head blocks)
    ([1024] * 32, 132, 2, 64),  # 32 x 16 tiles: 2 ranges a sequence, not 66 straddling ones
    ([4096] * 8, 132, 2, 64),  # 8 ranges a sequence
    ([1024] * 128, 132, 1, 128),  # 16 MLA heads: 1 range a sequence
    ([1024] * 256, 132, 2, 66),  # more sequences than programs: as many ranges as programs
    ([32768] * 32, 132, 2, 66),  # 16K tiles: 2 idle programs would cost more than a straddled boundary
    ([0, 32768, 0, 32768], 132, 2, 66),  # the sequences with tiles count: 2 of them, 33 ranges each (4: 64)
    ([100, 5000, 7], 132, 2, 39),  # 82 tiles, 41 ranges of 2 at most: 39, a multiple of the 3 sequences
    ([64] * 3, 132, 2, 1),  # 3 tiles, 2 at least a range: 1
])
def test_mla_ranges_fall_between_sequences_where_that_costs_little(lengths, programs, units, expected):
    assert ranges(lengths, programs, units) == expected


def test_dense_decode_takes_every_program():
    assert ranges([1024] * 32, 396, 4, min_tiles=1, align=False) == 99


@pytest.mark.parametrize("lengths, expected", [
    ([1024], 16),  # 16 tiles: one-tile ranges
    ([550] * 8, 72),  # 72 tiles, 55% of the programs: one-tile ranges (the seesaw at 64 heads: 17.1 -> 15.1 us)
    ([1024] * 8, 64),  # 128 tiles, 97%: two-tile ranges (18.2 -> 17.0 us)
    ([1024] * 6 + [512] * 2, 56),  # 112 tiles, 85%: two-tile ranges, 56 of them
])
def test_a_short_line_is_cut_into_one_tile_ranges_a_longer_one_into_two(lengths, expected):
    assert ranges(lengths, 132, 1, min_tiles=2, short_line=75) == expected
