"""The `memcheck` fixture and `@pytest.mark.memcheck`: measure a block of Python code with the same
collectors, rules and baselines as a workload. The item's baseline is stored under the stack name
`python`. Without --memcheck the block is still measured, but nothing is compared or failed.

A test that also uses pytest-benchmark's `benchmark` fixture gets the measured metrics in `benchmark.extra_info`
(`memcheck.<metric>`, and `memcheck.verdict` under --memcheck), saved beside its timings."""
from __future__ import annotations

import hashlib
import re

import pytest

from . import environment, rules
from .errors import UsageError
from .measurement import Measurement
from .metrics.collect import CollectorOptions, Collectors
from .runner import judge_item
from .stash import SESSION

STACK = "python"


def _name(nodeid: str) -> str:
    """The item's name and baseline folder: the whole node id, file included, so that two tests of one name in
    two files never share a baseline (tests-a-test_x.py-test_decode_step)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid).strip("-") or "block"


class CodeBlockMeter:
    """`with memcheck():` measures the block; `.measurement` and `.result` hold what it found."""

    def __init__(self, request):
        self.request = request
        self.measurement: Measurement | None = None
        self.result = None

    def __call__(self, name: str | None = None, thresholds: dict | None = None, device: str | None = None):
        self._name = name or _name(self.request.node.nodeid)
        self._thresholds = thresholds or {}
        self._device = device
        return self

    def __enter__(self):
        from .devices import resolve_device

        session = self.request.config.stash.get(SESSION, None)
        device = self._device or (session.settings.device if session else "auto")
        self.device = resolve_device(device)
        self.collectors = Collectors(self.device, CollectorOptions(in_process=True))
        self.collectors.start()
        self.collectors.run_started()
        return self

    def step(self, step: int, **values) -> None:
        self.collectors.step(step, **values)

    def __exit__(self, exc_type, exc, tb):
        self.collectors.run_finished()
        metrics = self.collectors.stop()
        if metrics.get("cpu.heap_alloc.peak") and metrics["cpu.heap_alloc.peak"].value is not None:
            metrics["cpu.heap_alloc.peak"].detail = "torch allocator memory events, above what was live at entry"
        digest = hashlib.sha256(self.request.node.nodeid.encode()).hexdigest()[:16]
        m = Measurement(self._name, STACK, str(self.request.node.path), scaled=False, digest=digest)
        m.metrics, m.timeline = metrics, self.collectors.timeline
        m.environment = {**environment.of_item(self.device, None, digest), "test": self.request.node.nodeid}
        self.measurement = m
        if exc_type is None:
            self._judge()
        self._to_benchmark()
        if self.result is not None and self.result.failed:
            pytest.fail(f"{self.result.id}: {self.result.verdict}: {self.result.reason}", pytrace=False)
        return False

    def _to_benchmark(self) -> None:
        """Into pytest-benchmark's extra_info, which --benchmark-json and --benchmark-autosave save with the
        timings (null metrics are left out, as in every export)."""
        if "benchmark" not in self.request.fixturenames:
            return
        extra = getattr(self.request.getfixturevalue("benchmark"), "extra_info", None)
        if not isinstance(extra, dict):  # a `benchmark` fixture that is not pytest-benchmark's
            return
        for name, metric in sorted(self.measurement.metrics.items()):
            if metric.value is not None:
                extra[f"memcheck.{name}"] = metric.value
        if self.result is not None:
            extra["memcheck.verdict"] = self.result.verdict.value

    def _judge(self) -> None:
        session = self.request.config.stash.get(SESSION, None)
        if session is None:
            return
        where = lambda f, msg: UsageError(msg, str(self.request.node.path),  # noqa: E731
                                          field=f"memcheck thresholds.{f}".rstrip("."))
        rule_set = rules.merge(session.project.thresholds, self._thresholds, where)
        self.result = judge_item(self.measurement, rule_set, session.settings)
        session.report.items.append(self.result)


@pytest.fixture
def memcheck(request) -> CodeBlockMeter:
    """Measure a block: `with memcheck(thresholds={...}): ...`."""
    return CodeBlockMeter(request)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("memcheck")
    if marker is None or not item.config.getoption("memcheck"):
        return (yield)
    meter = CodeBlockMeter(item._request)(name=marker.kwargs.get("name"),
                                          thresholds=marker.kwargs.get("thresholds"))
    with meter:
        return (yield)
