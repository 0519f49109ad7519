import json
import os
import signal
import subprocess
import sys
import time

import pytest

from memcheck.baselines import BaselineStore
from memcheck.errors import UsageError
from memcheck.measurement import Measurement
from memcheck.metrics.value import MetricValue


def measurement(value=100, workload="w", stack="hf"):
    m = Measurement(workload, stack, profile="ci", digest="d")
    m.environment = {"device_class": "cpu-x86_64", "torch": "2.13.0", "workload": "d", "profile": "ci"}
    m.metrics = {"cpu.heap_alloc.peak": MetricValue(value), "host.dtlb_misses": MetricValue.null("no PMU")}
    return m


def test_round_trip_and_changes(tmp_path):
    store = BaselineStore(tmp_path)
    path, changes = store.write(measurement(100))
    assert path == tmp_path / "cpu-x86_64" / "w" / "hf.json" and changes == ["new baseline"]
    b = store.load("cpu-x86_64", "w", "hf")
    assert b.metrics["cpu.heap_alloc.peak"].value == 100
    assert b.metrics["host.dtlb_misses"].reason == "no PMU"
    _, changes = store.write(measurement(200))
    assert changes == ["cpu.heap_alloc.peak: 100 B -> 200 B"]


def test_missing_is_none(tmp_path):
    assert BaselineStore(tmp_path).load("cpu-x86_64", "w", "hf") is None


@pytest.mark.parametrize("content,message", [
    ("{not json", "corrupt baseline"),
    ('{"schema": "something-else/1"}', "not a memcheck baseline"),
    ('{"schema": "memcheck.baseline/1", "workload": "other", "stack": "hf"}', r"baseline of other\[hf\]"),
    ('{"schema": "memcheck.baseline/1", "workload": "w", "stack": "hf"}', "malformed baseline"),
])
def test_corrupt_or_foreign_is_an_error_naming_the_file_and_never_replaced(tmp_path, content, message):
    store = BaselineStore(tmp_path)
    path = store.path("cpu-x86_64", "w", "hf")
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(UsageError, match=message) as e:
        store.load("cpu-x86_64", "w", "hf")
    assert str(path) in str(e.value)
    with pytest.raises(UsageError):
        store.write(measurement())
    assert path.read_text() == content


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    store = BaselineStore(tmp_path)
    path, _ = store.write(measurement(100))
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        store.write(measurement(200))
    assert path.read_text() == before
    assert os.listdir(path.parent) == ["hf.json"]


WRITER = """
import sys
from memcheck.baselines import BaselineStore
from memcheck.measurement import Measurement
from memcheck.metrics.value import MetricValue
store = BaselineStore(sys.argv[1])
i = 0
while True:
    m = Measurement("w", "hf", digest="d")
    m.environment = {"device_class": "cpu-x86_64"}
    # a large file, so a kill often lands in the middle of writing it
    m.metrics = {"cpu.heap_alloc.peak": MetricValue(i, samples=list(range(20000)))}
    store.write(m)
    i += 1
"""


def test_a_killed_writer_never_leaves_a_half_file(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(measurement(0))
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)])
        time.sleep(1.0 + 0.13 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        b = store.load("cpu-x86_64", "w", "hf")  # raises if the file were torn
        assert b.metrics["cpu.heap_alloc.peak"].value is not None
        json.loads(store.path("cpu-x86_64", "w", "hf").read_text())


def test_a_metric_whose_definition_changed_is_not_compared_with_a_baseline_of_the_old_one(tmp_path):
    # host.rss.peak is at revision 2 (file-backed pages no longer counted): a baseline written now says
    # so; one written before says nothing, reads as revision 1 and is not compared, however far apart.
    from memcheck import rules
    from memcheck.verdict import judge

    store = BaselineStore(tmp_path)
    m = measurement(100)
    m.metrics["host.rss.peak"] = MetricValue(300 * 2**20)
    path, _ = store.write(m)
    stored = json.loads(path.read_text())["metrics"]
    assert stored["host.rss.peak"]["revision"] == 2 and "revision" not in stored["cpu.heap_alloc.peak"]

    rule_set = {"host.rss.peak": rules.parse("host.rss.peak", {"max_increase": "8% and 24MiB"}, None)}
    m.metrics["host.rss.peak"] = MetricValue(400 * 2**20)
    assert judge(m, rule_set, store.load("cpu-x86_64", "w", "hf")).verdict == "regressed"

    del stored["host.rss.peak"]["revision"]
    path.write_text(json.dumps({**json.loads(path.read_text()), "metrics": stored}))
    result = judge(m, rule_set, store.load("cpu-x86_64", "w", "hf"))
    (check,) = result.checks
    assert result.verdict == "pass" and check.status == "not_compared"
    assert "revision 1" in check.message and "file-backed" in check.message and "refresh" in check.message
