"""The report JSON (memcheck.report/1): load it back, merge reports from parallel jobs and xdist workers."""
import json
import re

import pytest
import reportfactory as f

from memcheck.cli import main
from memcheck.errors import UsageError
from memcheck.reports.report import Report, merge
from memcheck.verdict import judge


def test_round_trip_is_exact(tmp_path):
    report = f.gpu_report()
    path = f.write(report, tmp_path / "r.json")
    assert Report.load(path).to_json() == report.to_json()


def test_load_names_the_file_on_a_wrong_schema(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "memcheck.baseline/1"}))
    with pytest.raises(UsageError, match=r"bad.json: not a memcheck report: schema is 'memcheck.baseline/1'"):
        Report.load(str(bad))
    bad.write_text("{")
    with pytest.raises(UsageError, match=r"bad.json:1: not JSON"):
        Report.load(str(bad))


def test_merge_two_jobs():
    gpu, cpu = f.gpu_report(), f.cpu_report()
    merged, replaced = merge([gpu, cpu])
    assert replaced == []
    assert [r.id for r in merged.items] == [r.id for r in cpu.items + gpu.items]  # oldest report first
    assert merged.summary == {"regressed": 1, "error": 1, "pass": 2, "skipped": 1}
    assert merged.failed
    assert merged.profile == "ci, full"
    assert [e["device_class"] for e in merged.environments] == ["cpu-x86_64", "nvidia-h200"]


def test_merge_keeps_the_newer_result_of_an_item_run_twice():
    old, new = f.cpu_report(), f.cpu_report()
    new.created = "2026-11-30T00:00:00+00:00"
    new.items[0].verdict = "improved"
    merged, replaced = merge([new, old])
    assert len(merged.items) == 1 and merged.items[0].verdict == "improved"
    assert replaced == ["tiny-dense-batch[hf] (cpu-x86_64): kept the result of the report created "
                        "2026-11-30T00:00:00+00:00"]


def test_same_item_on_two_device_classes_is_two_items():
    cpu = f.cpu_report()
    gpu = f.cpu_report()
    gpu.items[0].measurement.environment = dict(f.GPU_ENV)
    merged, replaced = merge([cpu, gpu])
    assert len(merged.items) == 2 and not replaced


def test_memcheck_merge_command(tmp_path, capsys):
    a = f.write(f.gpu_report(), tmp_path / "gpu.json")
    b = f.write(f.cpu_report(), tmp_path / "cpu.json")
    out = tmp_path / "merged.json"
    assert main(["merge", "-o", str(out), a, b]) == 0
    merged = Report.load(str(out))
    assert len(merged.items) == 5
    assert "merged 2 reports (5 items) into" in capsys.readouterr().out


def test_memcheck_merge_skips_nothing_silently(tmp_path, capsys):
    a = f.write(f.cpu_report(), tmp_path / "a.json")
    assert main(["merge", "-o", str(tmp_path / "m.json"), a, str(tmp_path / "missing.json")]) == 4
    assert "missing.json: cannot read the report" in capsys.readouterr().err


@pytest.mark.parametrize("field, value, message", [
    ("verdict", "<script>", "unknown verdict '<script>'"),
    ("floors", {"kv": "<img>"}, "floor 'kv' is str, not a number"),
    ("metrics", {"gpu.heap_alloc.peak": {"value": "1e9; rm -rf"}}, "metric 'gpu.heap_alloc.peak' is str"),
    ("checks", [{"metric": "m", "status": "<b>", "value": 1}], "unknown check status '<b>'"),
    ("environment", ["x"], "environment is not a mapping"),
    ("ranks", "abc", "ranks is not a list"),
    ("ranks", [{"metrics": {"kv.bytes.peak": 1}}], "ranks[0] is not a mapping of an integer rank and its metrics"),
    ("ranks", [{"rank": 0, "metrics": "x"}], "ranks[0] is not a mapping of an integer rank and its metrics"),
    ("ranks", [{"rank": 0, "metrics": {"kv.bytes.peak": "1 GiB"}}], "rank metric 'kv.bytes.peak' is str"),
])
def test_a_tampered_report_is_refused_in_one_line(tmp_path, field, value, message):
    """Reports of pull requests from forks come from untrusted code: anything but the schema is refused."""
    data = f.cpu_report().to_json()
    data["items"][0][field] = value
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="malformed item in memcheck report: " + re.escape(message)):
        Report.load(str(path))


def test_compared_across_and_rules_round_trip_and_old_reports_stay_readable(tmp_path):
    report = f.cpu_report()
    item = report.items[0]
    before = f.baseline(item.measurement, {"cpu.heap_alloc.peak": 1.0})
    before.environment["transformers"] = "5.16.0"
    judged = judge(item.measurement, f.rules(), before)
    assert judged.compared_across == [f"transformers 5.16.0 -> {item.measurement.environment['transformers']}"]
    report.items = [judged]
    data = json.loads(open(f.write(report, tmp_path / "r.json")).read())
    assert data["items"][0]["compared_across"] == judged.compared_across
    assert data["items"][0]["rules"]["cpu.heap_alloc.peak"]["relative"] == 0.02
    back = Report.load(str(tmp_path / "r.json")).items[0]
    assert back.compared_across == judged.compared_across and back.rule_set == judged.rule_set
    for key in ("compared_across", "rules"):  # a report of an earlier memcheck has neither
        del data["items"][0][key]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = Report.load(str(tmp_path / "old.json")).items[0]
    assert old.compared_across == [] and old.rule_set == {}
    data["items"][0]["rules"] = {"cpu.heap_alloc.peak": {"relative": "2%"}}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"bad.json: malformed item .*rule cpu.heap_alloc.peak.relative is str"):
        Report.load(str(tmp_path / "bad.json"))
