"""Exports for dashboards: OpenMetrics (GitLab metrics report), github-action-benchmark, Bencher, job summary."""
import json
import re

import jsonschema
import pytest
import reportfactory as f

from memcheck.cli import main
from memcheck.errors import UsageError
from memcheck.reports import exports
from memcheck.reports.report import merge

# OpenMetrics text: a metric line is name{labels} value; comments are TYPE/UNIT/HELP; the file ends with # EOF.
OM_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? '
                       r'-?[0-9.e+-]+$')
OM_META = re.compile(r"^# (TYPE [a-z_]+ gauge|UNIT [a-z_]+ [a-z]+|HELP [a-z_]+ .+)$")

# The Bencher Metric Format JSON schema, as Bencher publishes it.
BMF_SCHEMA = {"type": "object", "patternProperties": {".+": {"type": "object", "patternProperties": {".+": {
    "type": "object", "properties": {"value": {"type": "number"}, "lower_value": {"type": "number"},
                                     "upper_value": {"type": "number"}}, "required": ["value"]}}}}}


def test_openmetrics_is_well_formed_and_leaves_nulls_out():
    merged, _ = merge([f.gpu_report(), f.cpu_report()])
    text = exports.openmetrics(merged)
    lines = text.splitlines()
    assert lines[-1] == "# EOF" and text.endswith("\n")
    for line in lines[:-1]:
        assert OM_SAMPLE.match(line) or OM_META.match(line), line
    assert ('memcheck_gpu_heap_alloc_peak_bytes{workload="r1-distill-batch8",stack="hf",device_class="nvidia-h200"} '
            f"{18.3 * f.GiB!r}") in lines
    assert "# UNIT memcheck_gpu_heap_alloc_peak_bytes bytes" in lines
    # measured on CPU only: no GPU sample for the CPU item, never a 0 standing in for null
    assert not [ln for ln in lines if ln.startswith("memcheck_gpu_") and "cpu-x86_64" in ln]
    assert 'memcheck_items{verdict="regressed"} 1' in lines
    # every family declared once
    types = [ln for ln in lines if ln.startswith("# TYPE")]
    assert len(types) == len(set(types))


def test_openmetrics_escapes_label_values():
    text = exports.openmetrics(f.hostile_report())
    assert 'workload="<img src=x onerror=alert(1)>"' in text
    report = f.cpu_report()
    report.items[0].measurement.workload = 'a"b\\c'
    assert 'workload="a\\"b\\\\c"' in exports.openmetrics(report)


def test_github_action_benchmark_json():
    smaller = exports.benchmark_json(f.gpu_report())
    names = {e["name"] for e in smaller}
    assert "r1-distill-batch8[hf] gpu.heap_alloc.peak (nvidia-h200)" in names
    entry = next(e for e in smaller if e["name"].startswith("r1-distill-batch8[hf] gpu.heap_alloc.peak"))
    assert entry == {"name": entry["name"], "unit": "bytes", "value": 18.3 * f.GiB, "extra": "verdict: regressed"}
    assert all(set(e) <= {"name", "unit", "value", "range", "extra"} and isinstance(e["value"], (int, float))
               for e in smaller)
    assert not [e for e in smaller if "tokens_per_s" in e["name"]]  # a throughput goes to the bigger file


def test_benchmark_range_from_rounds():
    report = f.cpu_report()
    value = report.items[0].measurement.metrics["tokens_per_s"]
    value.value, value.samples = 45.0, [44.0, 45.0, 46.0]
    bigger = exports.benchmark_json(report, bigger_is_better=True)
    assert bigger == [{"name": "tiny-dense-batch[hf] tokens_per_s (cpu-x86_64)", "unit": "tokens/s", "value": 45.0,
                       "range": "± 1", "extra": "verdict: pass; rounds: 3"}]
    bmf = exports.bencher(report)
    assert bmf["tiny-dense-batch[hf]"]["tokens-per-s"] == {"value": 45.0, "lower_value": 44.0, "upper_value": 46.0}


def test_bencher_metric_format():
    bmf = exports.bencher(f.gpu_report())
    jsonschema.validate(bmf, BMF_SCHEMA)
    assert bmf["r1-distill-batch8[hf]"]["gpu-heap-alloc-peak"] == {"value": 18.3 * f.GiB}
    assert "r1-distill-batch8[vllm]" not in bmf  # skipped: nothing measured
    assert all(len(slug) <= 64 for measures in bmf.values() for slug in measures)


def test_bencher_asks_which_device_class_of_a_merged_report():
    merged, _ = merge([f.gpu_report(), f.cpu_report()])
    with pytest.raises(UsageError, match="the report holds cpu-x86_64 and nvidia-h200: choose one device class"):
        exports.bencher(merged)
    assert list(exports.bencher(merged, "cpu-x86_64")) == ["tiny-dense-batch[hf]"]


def test_step_summary_appends_without_marker(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert exports.github_step_summary(f.gpu_report()) == str(summary)
    text = summary.read_text()
    assert text.startswith("earlier step\n## memcheck: ❌ memory regression")
    assert "<!--" not in text
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert exports.github_step_summary(f.gpu_report()) is None


def test_memcheck_export_command(tmp_path, capsys, monkeypatch):
    report = f.write(f.gpu_report(), tmp_path / "r.json")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    out = {k: str(tmp_path / v) for k, v in (("html", "r.html"), ("md", "r.md"), ("om", "metrics.txt"),
                                               ("b", "b.json"), ("bb", "bb.json"), ("bmf", "bmf.json"))}
    assert main(["export", "--report", report, "--html", out["html"], "--markdown", out["md"], "--openmetrics",
                 out["om"], "--benchmark-json", out["b"], "--benchmark-json-bigger", out["bb"], "--bencher",
                 out["bmf"], "--github-summary"]) == 0
    assert capsys.readouterr().out.startswith("memcheck export: wrote ")
    assert "<svg" in open(out["html"]).read()
    assert json.load(open(out["b"])) and json.load(open(out["bb"])) == []
    assert (tmp_path / "summary.md").read_text().startswith("## memcheck")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert main(["export", "--report", report, "--github-summary"]) == 4
    assert "GITHUB_STEP_SUMMARY is not set" in capsys.readouterr().err
