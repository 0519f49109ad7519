"""Peak bytes of live torch CPU tensors, from the profiler's memory events alone.

torch's CPU allocator reports each allocation and free, with its running total of bytes allocated,
to the profiler while one is on. `torch.profiler.profile` also records every operator the workload
runs, which is what made it cost (tiny-dense-batch: 212 vs 148 ms of wall, 3x the page faults). Here
the same profiler is enabled with its operator callbacks restricted to a scope no workload uses, so
it records the allocator's memory events and nothing else: the same events, the same running total,
the same peak to the byte. Started before the model is built, so the peak includes the weights.
"""
from __future__ import annotations

import contextlib
import os
import sys

from .value import MetricValue

DETAIL = "torch allocator memory events (profiler, memory events only)"


def _memory_only_config():
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, RecordScope, _ExperimentalConfig

    config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig(), "")
    # Operator events are recorded for these scopes only: a static-runtime model never runs here.
    return config, {ProfilerActivity.CPU}, {RecordScope.STATIC_RUNTIME_MODEL}


def peak_of(events) -> int:
    """Peak bytes above what was live when the window opened, from a profiler's event tree."""
    from torch._C._profiler import _EventType

    allocations = []
    stack = list(events)
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            allocations.append((event.start_time_ns, event.extra_fields))
    if not allocations:
        return 0
    allocations.sort(key=lambda a: a[0])
    # The running total is process-wide and keeps bytes it saw allocated in an earlier window but not
    # freed in one: count from where this window started.
    first = allocations[0][1]
    start = first.total_allocated - first.alloc_size
    return max(fields.total_allocated for _, fields in allocations) - start


@contextlib.contextmanager
def _kineto_quiet():
    """Kineto writes `USDT: ... profiler_start` / `profiler_stop` to file descriptor 2 from C++ at each start and stop:
    in a fixture's process that lands in the failing test's captured stderr, beside the regression. Errors still
    raise as Python exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class CpuTensorCollector:
    def start(self) -> None:
        from torch._C._autograd import _enable_profiler, _prepare_profiler

        config, activities, scopes = _memory_only_config()
        with _kineto_quiet():
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities, scopes)

    def stop(self) -> dict[str, MetricValue]:
        from torch._C._autograd import _disable_profiler

        with _kineto_quiet():
            results = _disable_profiler()
        return {"cpu.heap_alloc.peak": MetricValue(peak_of(results.experimental_event_tree()), detail=DETAIL)}
