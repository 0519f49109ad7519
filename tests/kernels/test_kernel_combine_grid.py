"""The grid and tiles merge_partials picks for decode's combine, on the H200's 132 multiprocessors, without running it:
the shapes whose combine the H200 measured."""
import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import RecordedLaunch  # noqa: E402
from memcheck.kernels import work_split  # noqa: E402

H200_SMS = 132


def combine(monkeypatch, *, seqs, units, rows, head_dim, programs, partials=torch.float32):
    launch = RecordedLaunch()
    monkeypatch.setattr(work_split, "combine_cut_units", launch)
    monkeypatch.setattr(work_split, "sm_count", lambda device: H200_SMS)
    part_out = torch.empty(programs * 2 * rows * head_dim, dtype=partials)
    part_lse = torch.empty(programs * 2 * rows)
    out = torch.empty(seqs, units * rows, head_dim)
    work_split.merge_partials(part_out, part_lse, torch.full((seqs,), 1024, dtype=torch.int32), out, programs,
                              num_heads=units * rows, units=units, rows=rows, head_dim=head_dim, block_n=64,
                              min_tiles=2)
    c = launch.consts
    programs = launch.grid[0] * launch.grid[1] * launch.grid[2]
    return programs, (c["J_BLOCK"], c["ROW_BLOCK"], c["DIM_BLOCK"])


def test_128_mla_heads_at_batch_8_fill_the_gpu_without_thousands_of_programs(monkeypatch):
    # 2 units of 64 heads x 8 column blocks x 8 sequences: 512 programs at 16 rows. The split had counted no row
    # blocks (128 < 132) and went to 2 rows x 32 columns: 8192 programs, a 30 us combine.
    programs, (j, rows, dims) = combine(monkeypatch, seqs=8, units=2, rows=64, head_dim=512, programs=132)
    assert programs == 512 and (rows, dims) == (16, 64)
    assert j * rows * dims <= work_split.COMBINE_MAX_TILE


def test_few_sequences_split_rows_then_columns_until_a_program_a_multiprocessor(monkeypatch):
    # one long 16-head MLA sequence: 8 programs at 16 rows x 64 columns; halved to 2 rows, then 32 columns (128
    # programs), then to 8 columns so that a step takes all of its 132 partials (64 a step at 32 columns)
    programs, (j, rows, dims) = combine(monkeypatch, seqs=1, units=1, rows=16, head_dim=512, programs=132)
    assert (rows, dims) == (2, 8) and programs == 512
    assert j == work_split.COMBINE_J_SPLIT and j * rows * dims <= work_split.COMBINE_MAX_TILE
    # one 128-head sequence (2 units of 64, 66 partials each): 4 rows fill the GPU; its steps of 16 partials stay
    # unrolled (as one tile of 128 at 8 columns the H200 merged them in 15.5 us, not 7.6)
    programs, (j, rows, dims) = combine(monkeypatch, seqs=1, units=2, rows=64, head_dim=512, programs=132)
    assert (rows, dims, j) == (4, 64, 16) and programs == 256
    # one GQA 28/4 sequence over 396 programs (99 partials a KV head): 16 columns for one step of 128, not two of 64
    programs, (j, rows, dims) = combine(monkeypatch, seqs=1, units=4, rows=7, head_dim=128, programs=396)
    assert (rows, dims, j) == (2, 16, 128) and programs == 128
    # 8 sequences of GQA 28/4: 64 programs at 8 rows, 256 at 2 (rows halved twice, columns kept)
    programs, (j, rows, dims) = combine(monkeypatch, seqs=8, units=4, rows=7, head_dim=128, programs=396)
    assert (rows, dims) == (2, 64) and programs == 256


def test_a_sequence_of_few_partials_is_merged_in_the_blocks_that_fill_the_gpu(monkeypatch):
    # one 64-head sequence, bf16 partials: the grid is sized for 132 partials (512 programs of [2 rows, 32 columns],
    # in steps of a [64, 2, 32] tile); found to hold fewer than 16 at run time, it is merged by one program in 2 of
    # them, [2, 64] each: 256, one wave (2048 of [2, 8] took three at the 7 a multiprocessor that 72 registers leave)
    programs, (j, rows, dims) = combine(monkeypatch, seqs=1, units=1, rows=64, head_dim=512, programs=132,
                                        partials=torch.bfloat16)
    c = work_split.combine_cut_units.consts
    assert (programs, j, rows, dims) == (512, 64, 2, 32) and c["FEW_J"] == work_split.COMBINE_FEW_J
    assert (c["FEW_ROWS"], c["FEW_DIMS"]) == (2, 64)
    assert c["FEW_ROWS"] * c["FEW_DIMS"] * c["FEW_J"] <= work_split.COMBINE_MAX_TILE
    # steps already unrolled (8 sequences: 4 partials a step) take no such path
    assert combine(monkeypatch, seqs=8, units=1, rows=64, head_dim=512, programs=132)[1][0] <= 16
    assert work_split.combine_cut_units.consts["FEW_J"] == 0


@pytest.mark.parametrize("heads, step, programs", [(64, (64, 2, 32), 512), (32, (128, 2, 16), 512),
                                                   (16, (256, 2, 8), 512)])
def test_one_long_sequence_is_merged_in_steps_that_keep_the_grid_one_wave(monkeypatch, heads, step, programs):
    # 132 bf16 partials of one sequence (the seesaw's, the narrow kernel's at 16 heads): columns halved for more
    # partials a step only while the grid stays within COMBINE_WAVE programs a multiprocessor (its comment has the
    # H100's times): at 64 heads three steps on 512 programs, not one step on 2048; 16 heads keep one step
    got, (j, rows, dims) = combine(monkeypatch, seqs=1, units=1, rows=heads, head_dim=512, programs=132,
                                   partials=torch.bfloat16)
    assert ((j, rows, dims), got) == (step, programs)


def test_bf16_partials_of_many_sequences_take_twice_the_columns_a_program(monkeypatch):
    # 128 MLA heads x 32 and x 256 sequences of 1K, bf16 partials: 128 columns, half the programs (the H200 measured
    # 33.2 -> 32.0 and 185.3 -> 174.8 us a layer); a step still holds a sequence's 2 partials
    for seqs, programs in ((32, 1024), (256, 8192)):
        got, (j, rows, dims) = combine(monkeypatch, seqs=seqs, units=2, rows=64, head_dim=512, programs=132,
                                       partials=torch.bfloat16)
        assert (got, rows, dims, j) == (programs, 16, 128, 2), seqs
    # not at 8 sequences (a step would hold 2 of a sequence's ~9 partials: 31.9 -> 32.4 us), nor float32 partials
    assert combine(monkeypatch, seqs=8, units=2, rows=64, head_dim=512, programs=132,
                   partials=torch.bfloat16)[1][2] == 64
    assert combine(monkeypatch, seqs=32, units=2, rows=64, head_dim=512, programs=132)[1][2] == 64


@pytest.mark.parametrize("seqs, partials", [(16, 8), (32, 4), (256, 2)])
def test_partials_a_step_follow_a_sequences_share_of_the_ranges(monkeypatch, seqs, partials):
    # GQA 28/4, 396 programs (3 a multiprocessor): 99 ranges a KV head, so a sequence holds about 99 / seqs + 1 of
    # them; a step takes the next power of two (8 a step, as before, would mask half or more at 32 and 256)
    _, (j, rows, dims) = combine(monkeypatch, seqs=seqs, units=4, rows=7, head_dim=128, programs=396)
    assert j == partials and j * rows * dims <= work_split.COMBINE_MAX_TILE


@pytest.mark.parametrize("units, rows, head_dim, programs", [(4, 7, 128, 396), (2, 64, 512, 132), (1, 16, 512, 396)])
def test_any_batch_compiles_the_combine_of_a_power_of_two(monkeypatch, units, rows, head_dim, programs):
    """A mixed step decodes any count of sequences eagerly; the paged stack warms a CUDA graph for every power of two
    up to its largest batch (memcheck/stacks/paged/graphs.py BUCKETS), so a count between two compiles nothing new in
    the timed run: its constexprs are those of the power of two above it."""
    def consts(seqs):
        combine(monkeypatch, seqs=seqs, units=units, rows=rows, head_dim=head_dim, programs=programs)
        return {k: v for k, v in work_split.combine_cut_units.consts.items() if k.isupper()}

    for seqs in range(1, 65):
        assert consts(seqs) == consts(1 << (seqs - 1).bit_length()), seqs
