"""benchmarks/suites_h200.py on the CPU (nothing timed): a part starts only if its estimate fits what is left of
the call's budget, the run-to-run comparison reports a memory metric that moved, and reports of several calls
are read together."""
import json
import os
import sys

import pytest

from benchmarks import suites_h200 as sh
from memcheck.reports.report import SCHEMA as REPORT_SCHEMA


def report(ids_values: dict, metric="gpu.heap_alloc.peak") -> dict:
    return {"items": [{"id": i, "verdict": "pass", "metrics": {metric: {"value": v}}} for i, v in ids_values.items()]}


def test_a_part_whose_estimate_does_not_fit_the_budget_is_not_started(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(sh, "run_part", lambda out, tag, key, *a: started.append(key) or None)
    monkeypatch.setattr(sys, "argv", ["suites_h200.py", str(tmp_path), "--suites", "vl,r1-long,r1-batch",
                                      "--estimates", "vl=100,r1-long=500,r1-batch=200", "--budget-s", "400"])
    assert sh.main() == 0
    assert started == ["vl", "r1-batch"]
    assert "[run1 r1-long] not started: estimated 500 s" in capsys.readouterr().out


def test_a_memory_metric_that_moved_is_the_worst_difference(tmp_path):
    rows, worst = sh.repeat_rows(report({"a[paged]": 1000, "b[hf]": 2000}), report({"a[paged]": 1010, "b[hf]": 2000}))
    assert worst == 0.01
    assert [r[:2] for r in rows[1:]] == [("a[paged]", "gpu.heap_alloc.peak"), ("b[hf]", "gpu.heap_alloc.peak")]
    _, host_only = sh.repeat_rows(report({"a[hf]": 100}, "host.rss.peak"), report({"a[hf]": 150}, "host.rss.peak"))
    assert host_only == 0.0  # the worst is of gpu.* and kv.* metrics; host metrics are shown, not counted


def test_a_runs_folder_is_read_as_one_report_without_its_merge(tmp_path):
    for name, ids in (("vl.json", {"x[hf]": 1}), ("r1-long.json", {"y[hf]": 2}), ("merged.json", {"x[hf]": 1})):
        (tmp_path / name).write_text(json.dumps(report(ids)))
    assert sorted(i["id"] for i in sh._items(str(tmp_path))["items"]) == ["x[hf]", "y[hf]"]


def test_an_unknown_part_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["suites_h200.py", str(tmp_path), "--suites", "vl,r2"])
    with pytest.raises(SystemExit):
        sh.main()
    assert "--suites: no part named r2 (parts: vl, v2, r1-long, r1-batch, r1, vl-v2, v2-paged)" in capsys.readouterr().err


@pytest.mark.parametrize("argv,says", [
    (["--suites", "vl"], "OUT (the folder for the run's reports) is required, unless --compare"),
    (["--compare", "EMPTY", "EMPTY"], "--compare: EMPTY: no report items"),  # a folder with no report in it
])
def test_a_missing_out_or_an_empty_comparison_is_a_one_line_error(tmp_path, monkeypatch, capsys, argv, says):
    empty = str(tmp_path)
    monkeypatch.setattr(sys, "argv", ["suites_h200.py", *(empty if a == "EMPTY" else a for a in argv)])
    with pytest.raises(SystemExit):
        sh.main()
    assert says.replace("EMPTY", empty) in capsys.readouterr().err


def judged(item_id, verdict, now, base):
    return {"id": item_id, "verdict": verdict, "metrics": {k: {"value": v} for k, v in now.items()},
            "baseline": {"metrics": {k: {"value": v} for k, v in base.items()}}}


def test_every_gpu_and_kv_number_is_set_beside_its_baseline_and_a_moved_one_is_named():
    reports = {"r1": {"items": [
        judged("a[hf]", "pass", {"gpu.heap_alloc.peak": 100, "kv.bytes.peak": 7, "host.rss.peak": 5},
               {"gpu.heap_alloc.peak": 100, "kv.bytes.peak": 7, "host.rss.peak": 6}),
        judged("b[paged]", "pass", {"gpu.device_used.peak": None}, {"gpu.device_used.peak": 50}),
        judged("c[vllm]", "skipped", {}, {})]}}
    rows, moved, verdicts = sh.against_baselines(reports)
    assert [r[2:] for r in rows[1:]] == [("gpu.heap_alloc.peak", "100 B", "100 B", "yes"),
                                         ("kv.bytes.peak", "7 B", "7 B", "yes"),
                                         ("gpu.device_used.peak", "50 B", "null", "NO")]  # host.* not counted
    assert moved == ["b[paged] gpu.device_used.peak: 50 -> None"]
    assert verdicts == {"pass": 2, "skipped": 1}


def test_the_parts_seconds_are_set_beside_the_one_at_a_time_run(monkeypatch):
    monkeypatch.setattr(sh, "SECONDS", {"r1": 148.0, "vl-v2": 100.0})
    rows = sh.part_rows(["r1", "vl-v2"])
    assert rows[1] == ("r1", "296", "148.0", "0.50") and rows[-1] == ("all", "552", "248.0", "0.45")


def test_the_at_once_run_asks_pytest_for_workers_and_work_stealing(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sh.subprocess, "call", lambda cmd, **kw: seen.append(cmd) or 0)
    assert sh.run_part(str(tmp_path), "after", "vl-v2", False, None, "full", at_once=4) is None  # no report written
    cmd = seen[0]
    assert cmd[cmd.index("-n") + 1] == "4" and cmd[cmd.index("--dist") + 1] == "worksteal"
    assert sh.VL in cmd and sh.V2 in cmd and cmd[cmd.index("-k") + 1] == "not tp2"


def test_an_items_wait_for_the_gpu_is_its_own_column_not_timed_seconds():
    item = {"id": "a[hf]", "verdict": "pass", "metrics": {}, "gpu_seconds": 10.0,
            "phases": {"startup": 5.0, "gpu_wait": 20.0, "run": 10.0, "memory_round": 3.0}}
    header, row = sh.summary({"r1": {"items": [item]}})
    cells = dict(zip(header, row))
    assert (cells["worker s"], cells["waited s"], cells["timed s"], cells["memory round s"]) == \
        ("38.0", "20.0", "15.0", "3.0")


def test_a_parts_bounds_are_its_gpu_held_and_idle_seconds_and_its_longest_item(monkeypatch):
    items = [{"id": "long[hf]", "gpu_seconds": 60.0, "phases": {"startup": 15.0, "gpu_wait": 30.0, "run": 70.0}},
             {"id": "short[paged]", "gpu_seconds": 20.0, "phases": {"startup": 15.0, "run": 30.0}},
             {"id": "skipped[vllm]", "gpu_seconds": None, "phases": {}}]
    monkeypatch.setitem(sh.SECONDS, "r1", 130.0)
    header, row = sh.bound_rows({"r1": {"items": items}})
    assert dict(zip(header, row)) == {"part": "r1", "wall s": "130.0", "GPU held s": "80.0", "GPU idle s": "50.0",
                                      "longest item": "long[hf]", "its own s": "85.0", "waited s, all items": "30.0"}


def test_a_run_continued_in_a_second_call_is_tabled_over_the_parts_of_both(tmp_path, monkeypatch, capsys):
    def pytest_writing_a_report(cmd, **kw):
        path = cmd[cmd.index("--memcheck-report") + 1]
        part = os.path.basename(path)[:-5]
        item = {"id": f"{part}-item[hf]", "workload": f"{part}-item", "stack": "hf", "verdict": "pass", "metrics": {}}
        with open(path, "w") as f:
            json.dump({"schema": REPORT_SCHEMA, "items": [item]}, f)
        return 0

    clock = iter(range(0, 10_000, 50))  # each reading of the clock 50 s after the last
    monkeypatch.setattr(sh.subprocess, "call", pytest_writing_a_report)
    monkeypatch.setattr(sh.time, "time", lambda: float(next(clock)))
    monkeypatch.setattr(sh, "SECONDS", {})
    for estimates in ("r1=10,vl-v2=1000", "r1=1000,vl-v2=10"):  # the first call runs r1, the second vl-v2
        monkeypatch.setattr(sys, "argv", ["suites_h200.py", str(tmp_path), "--run", "after", "--suites", "r1,vl-v2",
                                          "--estimates", estimates, "--budget-s", "500", "--at-once", "2"])
        assert sh.main() == 0
    out = capsys.readouterr().out
    assert "after: vl-v2 in 250.0 s; from an earlier call: r1\n" in out
    assert json.loads((tmp_path / "after" / "seconds.json").read_text()) == {"r1": 50.0, "vl-v2": 50.0}
    assert sh.part_rows(["r1", "vl-v2"])[-1] == ("all", "552", "100.0", "0.18")
    merged = json.loads((tmp_path / "after" / "merged.json").read_text())
    assert sorted(i["id"] for i in merged["items"]) == ["r1-item[hf]", "vl-v2-item[hf]"]


def test_a_part_started_again_and_lost_is_not_tabled_from_the_earlier_call(tmp_path, monkeypatch):
    (tmp_path / "after").mkdir()
    (tmp_path / "after" / "r1.json").write_text(json.dumps(report({"old[hf]": 1})))
    (tmp_path / "after" / "seconds.json").write_text(json.dumps({"r1": 90.0}))
    assert list(sh.earlier_parts(str(tmp_path / "after"), ["r1"], {})) == ["r1"]  # not started: the earlier call's
    monkeypatch.setattr(sh.subprocess, "call", lambda cmd, **kw: 1)  # started again, and no report written
    assert sh.run_part(str(tmp_path), "after", "r1", False, None, "full") is None
    assert sh.earlier_parts(str(tmp_path / "after"), ["r1"], {}) == {}


@pytest.mark.parametrize("text,says", [("{\"r1\": 22", "not JSON"), ("[226.6]", "expected {part: seconds}")])
def test_a_runs_seconds_file_that_is_not_part_seconds_is_a_one_line_error_naming_it(tmp_path, text, says):
    (tmp_path / "seconds.json").write_text(text)
    with pytest.raises(SystemExit) as stop:
        sh.earlier_parts(str(tmp_path), ["r1"], {})
    assert str(stop.value).startswith(f"{tmp_path / 'seconds.json'}: {says}")
