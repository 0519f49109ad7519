"""benchmarks/prefill_timeline.py's arithmetic on made-up time stamps, on the CPU: the rates and fixed costs it reads
from the Hopper prefill's per-item stamps (memcheck/kernels/prefill_hopper.py, STAMP_NAMES) must be the ones that made them."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from benchmarks import prefill_timeline as pt  # noqa: E402


def stamp(buf, row, t0_ns, tiles, query=500, first=1000, per_tile=1600, store=300):
    """One item's stamps: turned at t0, the query `query` ns later, and so on; returns when it was stored."""
    times = [t0_ns, t0_ns + query, t0_ns + query + first, t0_ns + query + first + per_tile * (tiles - 1)]
    times.append(times[-1] + store)
    buf[row, :5] = torch.tensor(times)
    buf[row, 5] = tiles
    return times[-1]


def test_rates_and_the_busiest_program_from_the_stamps():
    buf = torch.zeros(8, 6, dtype=torch.int64)  # 2 programs x 2 rounds, spare rows never written
    start = 10_000_000
    stamp(buf, 1, stamp(buf, 0, start, 10), 4)  # program 0: 14 tiles
    stamp(buf, 3, stamp(buf, 2, start, 8), 3)  # program 1: 11 tiles
    r = pt.timeline(*pt.items(buf), rounds=2)
    assert (r["items"], r["programs"]) == (4, 2)
    assert r["per_tile_us"] == pytest.approx(1.6)
    assert (r["query_wait_us"], r["first_tile_us"], r["store_us"]) == pytest.approx((0.5, 1.0, 0.3))
    assert r["item_fixed_us"] == pytest.approx(1.8)  # query + first tile + store
    assert (r["busiest_items"], r["busiest_tiles"]) == (2, 14)
    assert r["busiest_tiles_us"] + r["busiest_fixed_us"] == pytest.approx(r["busiest_done_us"])
    assert r["span_us"] == pytest.approx(r["busiest_done_us"]) == pytest.approx(2 * 1.8 + 12 * 1.6)


def test_an_unwritten_buffer_is_an_error_not_a_row_of_zeros():
    with pytest.raises(ValueError, match="no item"):
        pt.timeline(*pt.items(torch.zeros(4, 6, dtype=torch.int64)), rounds=1)
