"""Exports of a report for the dashboards teams already have, so the history of every metric can be charted:

- GitLab metrics report (`artifacts:reports:metrics`): OpenMetrics text, one gauge per metric, one sample
  per item, compared by GitLab against the target branch in the merge-request widget.
- github-action-benchmark "custom" JSON: [{name, unit, value, range?, extra?}], one file per direction
  (tool `customSmallerIsBetter` for memory and time, `customBiggerIsBetter` for throughput).
- Bencher Metric Format (BMF) JSON: {benchmark: {measure: {value, lower_value?, upper_value?}}}, for
  `bencher run --adapter json --file ...`; one device class per file (Bencher keeps them apart as testbeds).
- pytest-benchmark's JSON (`--benchmark-json`): one benchmark per (item, memory or time metric), grouped by
  metric, so `pytest-benchmark compare` and its histograms read memcheck runs beside timed ones.
- The GitHub job summary: the Markdown report appended to $GITHUB_STEP_SUMMARY.

A metric that was not measured (null) is left out of every export: never written as 0.
"""
from __future__ import annotations

import json
import os
import re
import statistics

from ..errors import UsageError
from ..metrics.catalog import METRICS

# OpenMetrics unit suffixes (the UNIT must be the name's suffix); counts and rates carry none.
_OM_UNITS = {"bytes": "bytes", "ratio": "ratio", "s": "seconds"}
STEP_SUMMARY_LIMIT = 1024 * 1024 // 4  # characters: GitHub takes 1 MiB per step, 4 bytes per character at worst


def _measured(report):
    """(item, metric name, MetricValue) of every measured metric, in a stable order."""
    for item in report.items:
        for name in sorted(item.measurement.metrics):
            value = item.measurement.metrics[name]
            if value.value is not None and name in METRICS:
                yield item, name, value


def _device_class(item) -> str:
    return item.measurement.environment.get("device_class") or "unknown"


# -- OpenMetrics (GitLab metrics report) ------------------------------------------------------------------

def om_name(metric: str) -> str:
    unit = _OM_UNITS.get(METRICS[metric].unit)
    base = "memcheck_" + re.sub(r"[^a-zA-Z0-9_]", "_", metric)
    return f"{base}_{unit}" if unit and not base.endswith(unit) else base


def _om_label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))


def openmetrics(report) -> str:
    families: dict[str, list[str]] = {}
    for item, name, value in _measured(report):
        labels = (f'workload="{_om_label(item.measurement.workload)}",stack="{_om_label(item.measurement.stack)}",'
                  f'device_class="{_om_label(_device_class(item))}"')
        families.setdefault(name, []).append(f"{om_name(name)}{{{labels}}} {_om_number(value.value)}")
    lines = []
    for name in sorted(families):
        family = om_name(name)
        lines.append(f"# TYPE {family} gauge")
        unit = _OM_UNITS.get(METRICS[name].unit)
        if unit:
            lines.append(f"# UNIT {family} {unit}")
        help_text = METRICS[name].meaning.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family} {help_text}")
        lines.extend(families[name])
    lines.append("# TYPE memcheck_items gauge")
    lines.append("# HELP memcheck_items items per verdict in this report")
    for verdict, n in report.summary.items():
        lines.append(f'memcheck_items{{verdict="{verdict}"}} {n}')
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


# -- github-action-benchmark ------------------------------------------------------------------------------

def benchmark_json(report, bigger_is_better: bool = False) -> list[dict]:
    """Entries for github-action-benchmark's custom tools: smaller-is-better metrics by default (memory,
    time), or with `bigger_is_better` the throughput ones. Names carry the device class, so one chart
    never mixes a CPU runner with a GPU runner."""
    out = []
    for item, name, value in _measured(report):
        if METRICS[name].lower_is_worse != bigger_is_better:
            continue
        entry = {"name": f"{item.id} {name} ({_device_class(item)})", "unit": METRICS[name].unit,
                 "value": value.value}
        if len(value.samples) > 1:
            entry["range"] = f"± {statistics.stdev(value.samples):.6g}"
        entry["extra"] = f"verdict: {item.verdict}" + (f"; rounds: {len(value.samples)}" if value.samples else "")
        out.append(entry)
    return out


# -- Bencher Metric Format --------------------------------------------------------------------------------

def measure_slug(metric: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", metric.lower()).strip("-")


def bencher(report, device_class: str | None = None) -> dict:
    classes = sorted({_device_class(i) for i in report.items if i.measurement.environment})
    if device_class is None:
        if len(classes) > 1:
            raise UsageError(f"the report holds {' and '.join(classes)}: choose one device class for Bencher "
                             "(it keeps device classes apart as testbeds)")
        device_class = classes[0] if classes else None
    out: dict[str, dict] = {}
    for item, name, value in _measured(report):
        if _device_class(item) != device_class:
            continue
        metric = {"value": value.value}
        if len(value.samples) > 1:
            metric.update(lower_value=min(value.samples), upper_value=max(value.samples))
        out.setdefault(item.id, {})[measure_slug(name)] = metric
    return out


# -- pytest-benchmark ------------------------------------------------------------------------------------

PYTEST_BENCHMARK_VERSION = "5.1.0"  # the JSON layout written (unchanged through pytest-benchmark 5.3)


def pytest_benchmark(report) -> dict:
    """The report as pytest-benchmark's saved JSON. Each benchmark's data are the metric's rounds (one value
    without repeated rounds) in the metric's unit, named in its group: compare with `--time-unit s` so values
    are printed unscaled. Throughput (higher is better) is left out: pytest-benchmark ranks lower as better."""
    benchmarks = []
    for item, name, value in _measured(report):
        if METRICS[name].lower_is_worse:
            continue
        unit = METRICS[name].unit
        m = item.measurement
        benchmarks.append({
            "group": f"{name} ({unit})", "name": item.id, "fullname": f"{m.file}::{item.id}::{name}",
            "params": None, "param": None,
            "extra_info": {"metric": name, "unit": unit, "verdict": item.verdict, "device_class": _device_class(item),
                           "profile": m.profile, "stack": m.stack},
            "options": {"disable_gc": False, "timer": "memcheck", "min_rounds": 1, "max_time": 0, "min_time": 0,
                        "warmup": False},
            "stats": _benchmark_stats(value.samples or [value.value]),
        })
    env = report.environment
    return {
        "machine_info": {"node": env.get("device_class"), "machine": env.get("cpu"), "system": env.get("platform"),
                         "python_version": env.get("python"), "gpu": env.get("gpu"), "torch": env.get("torch")},
        "commit_info": {"id": env.get("git_sha")},
        "benchmarks": benchmarks, "datetime": report.created, "version": PYTEST_BENCHMARK_VERSION,
    }


def _benchmark_stats(data: list[float]) -> dict:
    """pytest-benchmark's statistics fields, by its definitions (quartiles: the medians of each half)."""
    ordered = sorted(data)
    n = len(ordered)
    mean = statistics.fmean(ordered)
    stddev = statistics.stdev(ordered) if n > 1 else 0.0
    half = n // 2
    q1 = statistics.median(ordered[:half]) if n > 1 else ordered[0]
    q3 = statistics.median(ordered[n - half:]) if n > 1 else ordered[0]
    iqr = q3 - q1
    low = [v for v in ordered if v >= q1 - 1.5 * iqr]
    high = [v for v in ordered if v <= q3 + 1.5 * iqr]
    stddev_out = sum(1 for v in ordered if abs(v - mean) > stddev)
    iqr_out = sum(1 for v in ordered if v < q1 - 1.5 * iqr or v > q3 + 1.5 * iqr)
    total = sum(ordered)
    return {"min": ordered[0], "max": ordered[-1], "mean": mean, "stddev": stddev, "rounds": n,
            "median": statistics.median(ordered), "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_out,
            "stddev_outliers": stddev_out, "outliers": f"{stddev_out};{iqr_out}", "ld15iqr": low[0],
            "hd15iqr": high[-1], "ops": n / total if total else 0, "total": total, "data": list(data),
            "iterations": 1}


# -- GitHub job summary -----------------------------------------------------------------------------------

def github_step_summary(report, path: str | None = None, artifact_url: str | None = None) -> str | None:
    """Append the Markdown report to the job summary ($GITHUB_STEP_SUMMARY); returns the path written."""
    path = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    from .markdown import render

    body = render(report, artifact_url=artifact_url, limit=STEP_SUMMARY_LIMIT, platform="the GitHub job summary",
                  marker=False)
    with open(path, "a", encoding="utf-8") as f:
        f.write(body + "\n")
    return path


# -- writing ----------------------------------------------------------------------------------------------

def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write(report, *, html: str | None = None, markdown: str | None = None, openmetrics_path: str | None = None,
          benchmark: str | None = None, benchmark_bigger: str | None = None, bencher_path: str | None = None,
          bencher_device_class: str | None = None, step_summary: bool = False,
          artifact_url: str | None = None, pytest_benchmark_path: str | None = None) -> list[str]:
    """Write every export asked for; returns what was written, for the caller to print."""
    written = []
    if markdown:
        from .markdown import render

        write_text(markdown, render(report, artifact_url=artifact_url))
        written.append(markdown)
    if html:
        from . import html as html_report

        html_report.write(report, html, artifact_url)
        written.append(html)
    if openmetrics_path:
        write_text(openmetrics_path, openmetrics(report))
        written.append(openmetrics_path)
    for path, bigger in ((benchmark, False), (benchmark_bigger, True)):
        if path:
            write_text(path, json.dumps(benchmark_json(report, bigger), indent=1) + "\n")
            written.append(path)
    if pytest_benchmark_path:
        write_text(pytest_benchmark_path, json.dumps(pytest_benchmark(report), indent=1) + "\n")
        written.append(pytest_benchmark_path)
    if bencher_path:
        write_text(bencher_path, json.dumps(bencher(report, bencher_device_class), indent=1) + "\n")
        written.append(bencher_path)
    if step_summary:
        summary = github_step_summary(report, artifact_url=artifact_url)
        if summary:
            written.append(summary)
    return written
