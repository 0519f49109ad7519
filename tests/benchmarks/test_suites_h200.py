"""benchmarks/suites_h200.py on the CPU (nothing timed): a part starts only if its estimate fits what is left of
the call's budget, the run-to-run comparison reports a memory metric that moved, and reports of several calls
are read together."""
import json
import sys

import pytest

from benchmarks import suites_h200 as sh


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
    monkeypatch.setattr(sys, "argv", ["suites_h200.py", str(tmp_path), "--suites", "vl,r1"])
    with pytest.raises(SystemExit):
        sh.main()
    assert "--suites: no part named r1 (parts: vl, v2, r1-long, r1-batch)" in capsys.readouterr().err


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
