"""benchmarks/decode_timeline.py's arithmetic on made-up time stamps, on the CPU: the spans, the tail and each
program's work by multiprocessor must be the ones that made the stamps (memcheck/kernels/stamps.py: 4 times, 2
optional ones, then %smid)."""
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from benchmarks import decode_timeline as dt  # noqa: E402
from memcheck.kernels import stamps  # noqa: E402


def test_work_by_multiprocessor_and_the_slowest_from_the_stamps():
    buf = torch.zeros(6, stamps.SLOTS, dtype=torch.int64)  # 4 programs ran, 2 spare rows never written
    t0 = 10_000_000
    for pid, (sm, work_ns) in enumerate([(0, 300_000), (7, 280_000), (8, 320_000), (15, 290_000)]):
        # sm 0 is a place, not unwritten; the first tile's stamps not written (a kernel that does not take them)
        buf[pid] = torch.tensor([t0, t0 + 250, t0 + 1000, t0 + 1000 + work_ns, 0, 0, sm])
    r = dt.timeline(buf, dt.CASES["mla16-b32x32K"])
    assert r["programs"] == 4
    assert r["work_by_sm_us"] == {0: 300.0, 7: 280.0, 8: 320.0, 15: 290.0}
    assert r["slowest_sms"] == "8:320 0:300 15:290 7:280"
    assert r["work_max_us"] == pytest.approx(320.0)
    assert r["span_us"] == pytest.approx(321.0)  # first started -> last done
    assert r["first_done_us"] == pytest.approx(281.0)
    assert "first_in_p50_us" not in r


def test_the_first_tiles_stamps_where_the_kernel_takes_them():
    buf = torch.zeros(3, stamps.SLOTS, dtype=torch.int64)
    t0 = 10_000_000
    for pid, (tile_in, tile1) in enumerate([(5_000, 500), (6_000, 700), (7_000, 600)]):
        ranged = t0 + 1000
        first_in = ranged + tile_in
        buf[pid] = torch.tensor([t0, t0 + 250, ranged, ranged + 20_000, first_in, first_in + tile1, pid])
    r = dt.timeline(buf, dt.CASES["mla16-b1x1K"])
    assert r["first_in_p50_us"] == pytest.approx(6.0)  # range known -> the first tile's data in
    assert r["first_tile_p50_us"] == pytest.approx(0.6)  # its products


def test_a_kernel_without_the_first_tiles_stamps_prints_a_dash_there():
    buf = torch.tensor([[10_000, 10_001, 10_002, 10_003, 0, 0, 1]])
    row = {"case": "gqa28-b1x4K", "floor_us": 1.0, "layer_off_us": 2.0, "layer_on_us": 2.0, "no_merge_us": 1.5,
           "rest_us": 1.0, **dt.timeline(buf, dt.CASES["gqa28-b1x4K"])}
    cells = dt.table([row]).splitlines()[-1].split()
    headings = dt.table([row]).splitlines()[-2].split()
    assert cells[headings.index("in")] == cells[headings.index("tile1")] == "-"


def test_an_unwritten_buffer_is_an_error_not_a_row_of_zeros():
    with pytest.raises(ValueError, match="no program"):
        dt.timeline(torch.zeros(4, stamps.SLOTS, dtype=torch.int64), dt.CASES["mla16-b32x32K"])


@pytest.fixture
def interpreted_timeline(monkeypatch):
    """decode_timeline with its stand-in kernel defined for the interpreter (triton.jit reads TRITON_INTERPRET when a
    kernel is defined); defined again for the GPU after."""
    pytest.importorskip("triton")
    import importlib
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield importlib.reload(dt)
    monkeypatch.delenv("TRITON_INTERPRET")
    importlib.reload(dt)


def test_the_emptied_merge_launches_on_the_merges_grid_and_merges_nothing(interpreted_timeline):
    from memcheck.kernels import mla
    gen = torch.Generator().manual_seed(0)
    lens = torch.tensor([40, 17, 70], dtype=torch.int32)  # 16-token tiles off the GPU: 3, 2 and 5 on 4 programs
    table = torch.randperm(24, generator=gen, dtype=torch.int32).view(3, 8)
    latent = torch.randn(24, 16, 576, generator=gen)
    q, q_pe = torch.randn(3, 16, 512, generator=gen), torch.randn(3, 16, 64, generator=gen)
    full = mla.mla_decode(q, q_pe, latent, table, lens, 0.07, num_programs=4)
    grids = []
    stand_in = interpreted_timeline._BoundaryLaunch
    real = stand_in.__getitem__
    out = torch.full_like(q, 7.0)
    with interpreted_timeline.merge_emptied(), \
            mock.patch.object(stand_in, "__getitem__", lambda self, grid: grids.append(grid) or real(self, grid)):
        mla.mla_decode(q, q_pe, latent, table, lens, 0.07, num_programs=4, out=out)
    whole = (out != 7.0).all(dim=(1, 2))
    # 10 tiles in 3 ranges (aligned to the 3 sequences: work_split.line_ranges): the first two whole, the last cut
    assert whole.tolist() == [True, True, False]
    assert torch.equal(out[:2], full[:2])
    assert len(grids) == 1 and grids[0][0] == 3  # one launch, a row of programs a sequence, as the merge's
