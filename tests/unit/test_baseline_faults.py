"""A fault in one item's baseline is that item's error, in one line naming the path and the cause; nothing else of
the run is lost: the other items are judged, reports are written (or written elsewhere, saying where), no `.tmp`
file stays behind, and a malformed baseline is replaced only by a refresh, which says so."""
import errno
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memcheck import plugin
from memcheck.baselines import MENDING, SCHEMA, BaselineStore
from memcheck.errors import UsageError
from memcheck.measurement import Measurement
from memcheck.metrics.value import MetricValue
from memcheck.runner import Settings, judge_item

ENV = {"device_class": "cpu-x86_64", "profile": "ci", "workload": "d1", "torch": "2.13.0"}


def measurement(name="w") -> Measurement:
    return Measurement(name, "hf", digest="d1", environment=dict(ENV),
                       metrics={"kv.bytes.peak": MetricValue(1000), "host.rss.peak": MetricValue(2**28)})


def baseline_file(root, data, name="w"):
    path = root / "cpu-x86_64" / name / "hf.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def stored(**changes):
    data = {"schema": SCHEMA, "workload": "w", "stack": "hf", "recorded": "2026-12-01T00:00:00+00:00", "rounds": 1,
            "environment": dict(ENV), "metrics": {"kv.bytes.peak": {"value": 1000}}}
    data.update(changes)
    return data


@pytest.mark.parametrize("changes, problem", [
    ({"metrics": {"kv.bytes.peak": {"value": "lots"}}}, 'metrics.kv.bytes.peak.value: "lots" is not a number'),
    ({"environment": []}, "environment: missing or not a mapping"),
    ({"environment": {**ENV, "torch": {"v": 2}}}, 'environment.torch: {"v": 2} is not a version or a name'),
    ({"metrics": {"kv.bytes.peak": {"value": 1, "samples": [1, "x"]}}}, "metrics.kv.bytes.peak.samples: not a list"),
    ({"rounds": "3"}, 'rounds: "3" is not a count'),
])
def test_a_baseline_of_the_wrong_shape_at_any_depth_is_the_items_one_line_error(tmp_path, changes, problem):
    path = baseline_file(tmp_path, stored(**changes))
    before = path.read_text()
    result = judge_item(measurement(), {}, Settings(baselines=str(tmp_path)))
    assert result.verdict == "error" and result.failed
    assert result.reason.startswith(f"{path}: malformed baseline: {problem}") and result.reason.endswith(MENDING)
    assert path.read_text() == before  # a gate never overwrites it
    refreshed = judge_item(measurement(), {}, Settings(baselines=str(tmp_path), update_baselines=True))
    assert refreshed.verdict == "new" and not refreshed.failed
    assert refreshed.reason.startswith(f"replaced an unreadable baseline: malformed baseline: {problem}")
    assert MENDING not in refreshed.reason and refreshed.updated == [refreshed.reason]
    assert BaselineStore(tmp_path).load("cpu-x86_64", "w", "hf").metrics["kv.bytes.peak"].value == 1000


def test_a_baseline_that_cannot_be_written_is_the_items_error_and_leaves_no_tmp(tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("memcheck.baselines.os.replace", full)
    result = judge_item(measurement(), {}, Settings(baselines=str(tmp_path), update_baselines=True))
    assert result.verdict == "error"
    assert result.reason == f"cannot write the baseline {tmp_path}/cpu-x86_64/w/hf.json: No space left on device"
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no .tmp, no half file
    monkeypatch.undo()
    other = judge_item(measurement("v"), {}, Settings(baselines=str(tmp_path), update_baselines=True))
    assert other.verdict == "new" and other.updated == ["new baseline"]  # the next item is written as usual


def test_a_report_that_cannot_be_written_goes_to_the_temporary_folder_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "blocked").write_text("a file where the report's folder should be")
    written = []
    plugin._write_or_fall_back(lambda p: (os.makedirs(os.path.dirname(p), exist_ok=True), written.append(p)),
                               str(tmp_path / "blocked" / "r.json"))
    fallback = str(tmp_path / "tmp" / "memcheck-r.json")
    assert written == [fallback]
    assert f"written to {fallback} instead" in capsys.readouterr().err


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=3), max_leaves=12)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metrics=json_values, environment=json_values, rounds=json_values, cut=st.integers(0, 400))
def test_random_shapes_and_truncations_are_an_error_or_a_baseline_never_a_traceback(tmp_path, metrics, environment,
                                                                                    rounds, cut):
    for text in (json.dumps(stored(metrics=metrics, environment=environment, rounds=rounds)),
                 json.dumps(stored())[:cut]):
        baseline_file(tmp_path, None).write_text(text)
        try:
            baseline = BaselineStore(tmp_path).load("cpu-x86_64", "w", "hf")
        except UsageError:
            continue
        for value in baseline.metrics.values():  # what judging reads: numbers or nothing
            assert value.value is None or isinstance(value.value, (int, float))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(verdict=st.sampled_from(["pass", "regressed", "error", "improved", "new", "incomparable", "skipped"]),
       extra=st.dictionaries(st.sampled_from(["metrics", "environment", "checks", "floors", "ranks", "notes", "baseline",
                                              "rules", "timeline", "error", "compared_across", "reason"]),
                             json_values, max_size=6),
       cut=st.integers(0, 300))
def test_random_report_items_are_an_error_or_a_report_that_renders(verdict, extra, cut):
    """The JSON report and `memcheck merge` read reports of other jobs: a wrong shape is one UsageError naming the
    file, never a traceback from rendering it later."""
    from memcheck.reports.markdown import render
    from memcheck.reports.report import SCHEMA as REPORT_SCHEMA
    from memcheck.reports.report import Report

    item = {"verdict": verdict, "workload": "w", "stack": "hf", **extra}
    data = {"schema": REPORT_SCHEMA, "created": "2026-12-01T00:00:00+00:00", "items": [item]}
    for candidate in (data, json.dumps(data)[:cut]):
        try:
            report = Report.from_json(candidate if isinstance(candidate, dict) else json.loads(candidate), "r.json")
        except (UsageError, json.JSONDecodeError):
            continue
        render(report)
