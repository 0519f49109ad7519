"""The `memcheck` fixture and `@pytest.mark.memcheck`: measure a block of Python code with the same
collectors, rules and baselines as a workload. The item's baseline is stored under the stack name
`python`. Without --memcheck the block is still measured, but nothing is compared or failed."""
from __future__ import annotations

import hashlib
import re

import pytest

from . import environment, rules
from .baselines import BaselineStore
from .errors import UsageError
from .measurement import Measurement
from .metrics.collect import CollectorOptions, Collectors
from .verdict import judge

STACK = "python"


def _name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid.split("::", 1)[-1]).strip("-") or "block"


class BlockMeter:
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
        from .measure import resolve_device

        session = self.request.config.stash.get(_session_key(), None)
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
        m.environment = {**environment.fingerprint(self.device), "profile": None, "workload": digest}
        self.measurement = m
        if exc_type is None:
            self._judge()
        return False

    def _judge(self) -> None:
        session = self.request.config.stash.get(_session_key(), None)
        if session is None:
            return
        m = self.measurement
        rule_set = dict(session.project.thresholds)
        where = lambda f, msg: UsageError(msg, str(self.request.node.path), field=f"memcheck thresholds.{f}")  # noqa: E731
        for metric, raw in self._thresholds.items():
            rule = rules.parse(metric, raw, where)
            if rule is None:
                rule_set.pop(metric, None)
            else:
                rule_set[metric] = rule
        store = BaselineStore(session.settings.baselines)
        try:
            baseline, error = store.load(m.environment["device_class"], m.workload, STACK), None
        except UsageError as e:
            baseline, error = None, str(e)
        self.result = judge(m, rule_set, baseline, error)
        if session.settings.update_baselines:
            path, changes = store.write(m)
            self.result.baseline_path, self.result.updated = str(path), changes
        session.report.items.append(self.result)
        if self.result.failed:
            pytest.fail(f"{self.result.id}: {self.result.verdict}: {self.result.reason}", pytrace=False)


def _session_key():
    from .plugin import STASH

    return STASH


@pytest.fixture
def memcheck(request) -> BlockMeter:
    """Measure a block: `with memcheck(thresholds={...}): ...`."""
    return BlockMeter(request)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("memcheck")
    if marker is None or not item.config.getoption("memcheck"):
        return (yield)
    meter = BlockMeter(item._request)(name=marker.kwargs.get("name"), thresholds=marker.kwargs.get("thresholds"))
    with meter:
        return (yield)
