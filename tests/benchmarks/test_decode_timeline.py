"""benchmarks/decode_timeline.py's arithmetic on made-up time stamps, on the CPU: the spans, the tail and each
program's work by multiprocessor must be the ones that made the stamps (memcheck/kernels/stamps.py: 4 times, then %smid)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from benchmarks import decode_timeline as dt  # noqa: E402
from memcheck.kernels import stamps  # noqa: E402


def test_work_by_multiprocessor_and_the_slowest_from_the_stamps():
    buf = torch.zeros(6, stamps.SLOTS, dtype=torch.int64)  # 4 programs ran, 2 spare rows never written
    t0 = 10_000_000
    for pid, (sm, work_ns) in enumerate([(0, 300_000), (7, 280_000), (8, 320_000), (15, 290_000)]):
        buf[pid] = torch.tensor([t0, t0 + 250, t0 + 1000, t0 + 1000 + work_ns, sm])  # sm 0 is a place, not unwritten
    r = dt.timeline(buf, dt.CASES["mla16-b32x32K"])
    assert r["programs"] == 4
    assert r["work_by_sm_us"] == {0: 300.0, 7: 280.0, 8: 320.0, 15: 290.0}
    assert r["slowest_sms"] == "8:320 0:300 15:290 7:280"
    assert r["work_max_us"] == pytest.approx(320.0)
    assert r["span_us"] == pytest.approx(321.0)  # first started -> last done
    assert r["first_done_us"] == pytest.approx(281.0)


def test_an_unwritten_buffer_is_an_error_not_a_row_of_zeros():
    with pytest.raises(ValueError, match="no program"):
        dt.timeline(torch.zeros(4, stamps.SLOTS, dtype=torch.int64), dt.CASES["mla16-b32x32K"])
