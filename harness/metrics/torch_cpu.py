"""Peak bytes of live torch CPU tensors, from the profiler's memory events.

The profiler reports each CPU allocation with the running total of bytes allocated since it
started; it is started before the model is built, so the peak includes the weights.
"""
from __future__ import annotations

from .value import MetricValue


class CpuTensorCollector:
    def __init__(self):
        self._prof = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        self._prof.__enter__()

    def stop(self) -> dict[str, MetricValue]:
        from torch._C._profiler import _EventType

        self._prof.__exit__(None, None, None)
        allocations = []
        stack = list(self._prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
                allocations.append((event.start_time_ns, event.extra_fields))
        self._prof = None
        if not allocations:
            return {"cpu.heap_alloc.peak": MetricValue(0, detail="torch profiler memory events: no allocation")}
        allocations.sort(key=lambda a: a[0])
        # The profiler's running total is process-wide and keeps bytes it saw allocated in an earlier
        # window but not freed in one: count from where this window started.
        first = allocations[0][1]
        start = first.total_allocated - first.alloc_size
        peak = max(fields.total_allocated for _, fields in allocations) - start
        return {"cpu.heap_alloc.peak": MetricValue(peak, detail="torch profiler memory events")}
