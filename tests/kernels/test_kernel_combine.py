"""decode's combine (work_split.merge_partials) under the interpreter, on partials written by hand for a sequence cut
into one-tile ranges (beside a whole one), against torch's merge of the same partials; the grid sized as on the H200's
132 multiprocessors, where the launch takes one [J, rows, columns] tile a step and a sequence of up to 64 partials is
merged by one program of each larger block (the rest of the grid ends at once)."""
import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import RecordedLaunch, assert_close  # noqa: E402
from memcheck.kernels import work_split  # noqa: E402

H200_SMS, BLOCK_N = 132, 64


def merged(part_out, part_lse):
    """The merge of [partials, rows, columns] outputs by their base-2 log-sum-exps [partials, rows]."""
    weights = torch.softmax(part_lse * torch.log(torch.tensor(2.0)), 0)
    return (weights[:, :, None] * part_out).sum(0)


@pytest.mark.parametrize("few_j", [16, 0], ids=["few-partials-unrolled", "partials-as-one-tile"])
@pytest.mark.parametrize("tiles", [16, 17, 64, 65], ids=["16-partials", "17-partials", "64-partials", "65-partials"])
@pytest.mark.parametrize("min_tiles, short_line", [(1, 0), (2, 75)], ids=["one-tile-ranges", "short-line"])
def test_a_sequence_cut_into_one_tile_ranges_is_merged_from_its_partials(monkeypatch, tiles, few_j, min_tiles,
                                                                         short_line):
    """As one-tile ranges cut it: by min_tiles 1, or by a line short enough for them (short_line, the seesaw's at 32
    and 64 heads: its attention kernel and the merge must cut the line alike). Up to 16 partials the few-partials
    programs merge them in one unrolled step, up to 64 as one tile; 65 take the whole grid's steps."""
    monkeypatch.setattr(work_split, "COMBINE_FEW_J", few_j)
    merge_one_tile_ranges(monkeypatch, tiles, min_tiles, short_line, torch.float32)


@pytest.mark.parametrize("wave, step, lanes", [(4, (256, 8), False), (1, (128, 16), True), (0.5, (64, 32), True)],
                         ids=["one-step", "two-steps", "three-steps"])
def test_a_long_sequences_partials_are_merged_in_steps_that_keep_one_wave(monkeypatch, wave, step, lanes):
    """130 bf16 partials (the seesaw's) on a grid sized for 264 (two programs a multiprocessor): columns are halved for
    more partials a step while the grid stays within COMBINE_WAVE programs a multiprocessor; at 4, one step of 256
    (256 programs), at 1 the halving stops at 128 programs, two steps of 128; at half a program, none: three of 64.
    In more steps than one, each of a step's lanes keeps its own running state until the last (LANES)."""
    monkeypatch.setattr(work_split, "COMBINE_WAVE", wave)
    consts = merge_one_tile_ranges(monkeypatch, 130, 1, 0, torch.bfloat16, programs=2 * H200_SMS)
    assert (consts["J_BLOCK"], consts["DIM_BLOCK"], consts["LANES"]) == (*step, lanes)


def merge_one_tile_ranges(monkeypatch, tiles, min_tiles, short_line, partials, programs=H200_SMS):
    """A sequence of `tiles` tiles cut into one-tile ranges, then one whole in the next range, merged on the H200's
    grid against torch's merge of the same partials (held in `partials`' dtype); the launch's constexprs."""
    monkeypatch.setattr(work_split, "sm_count", lambda device: H200_SMS)
    launch = RecordedLaunch(work_split.combine_cut_units)
    monkeypatch.setattr(work_split, "combine_cut_units", launch)
    rows, heads, head_dim = 16, 12, 128  # the last 4 rows of the unit are padding
    gen = torch.Generator().manual_seed(tiles)
    held_out = torch.randn(tiles, heads, head_dim, generator=gen).to(partials)
    held_lse = 4 * torch.randn(tiles, heads, generator=gen)
    # program j's partial of the sequence: slot 0 (its range starts inside it), the unit's rows; NaN wherever no
    # partial was written, which a merge that read it would carry to the output
    part_out = torch.full((programs, 2, rows, head_dim), float("nan"), dtype=partials)
    part_lse = torch.full((programs, 2, rows), float("nan"))
    part_out[:tiles, 0, :heads], part_lse[:tiles, 0, :heads] = held_out, held_lse
    # and a sequence of one tile, whole in the next program's range: its output, written by the attention kernel,
    # is the merge's to leave alone
    out = torch.full((2, heads, head_dim), float("nan"))
    out[1] = whole = torch.randn(heads, head_dim, generator=gen)
    seq_lens = torch.tensor([tiles * BLOCK_N - 5, 10], dtype=torch.int32)
    work_split.merge_partials(part_out.flatten(), part_lse.flatten(), seq_lens, out, programs, num_heads=heads,
                              units=1, rows=rows, head_dim=head_dim, block_n=BLOCK_N, min_tiles=min_tiles,
                              short_line=short_line)
    assert_close(out[0], merged(held_out.float(), held_lse))
    assert torch.equal(out[1], whole)
    return launch.consts
