"""All collectors of one measurement, started and stopped together around a stack's work.

Order: start() before the model is built (peaks include weights), run_started() before generation,
step() from the stack after each decode step (timeline), run_finished() when the run returned,
stop() after the stack is closed.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from ..devices import is_cuda

from .catalog import METRICS
from .host import HEAP_OFF, HostCollector, ResidentReader
from .value import MetricValue

NO_GPU = "no CUDA device on this runner"


CPU_TENSORS_OFF = "CPU tensor tracking switched off"
# Null for these reasons in a timed round: measured in the memory round (memcheck/runner.py).
SWITCHED_OFF = {"host.heap_alloc.peak": HEAP_OFF, "cpu.heap_alloc.peak": CPU_TENSORS_OFF}


@dataclass
class CollectorOptions:
    python_heap: bool = True  # tracemalloc: host.heap_alloc.peak (a worker runs it in a heap round of its own)
    cpu_tensors: bool = True  # the CPU allocator's memory events: cpu.heap_alloc.peak (CPU runners)
    sample_period_s: float = 0.01
    in_process: bool = False  # measuring a block inside a longer-lived process (the fixture)
    # Trace the Python heap through the warm-up of a stack whose warm-up is the workload once (warmup_moves_memory
    # False: hf on a GPU), so the timed round measures host.heap_alloc.peak and needs no memory round of its own.
    heap_in_warmup: bool = False
    # Other items run on the same GPU at the same time (memcheck/device_share.py): NVML's device-wide reading
    # would count their memory, so gpu.device_used.peak is this process tree's or null.
    device_shared: bool = False
    # A prediction (memcheck/predict/): the device is fake, its counters the allocator model's; nothing to poll.
    predicted: bool = False
    # A tensor-parallel rank: the process group's threads free tensors and take the GIL on their own, and a
    # tracemalloc.stop() racing them crashes Python before 3.12.9 / 3.13.2 (CPython gh-128679). The heap's peak is
    # read when the run returns; the trace stops once the group is left (rank_workers.finish_rank).
    in_rank: bool = False


class Collectors:
    def __init__(self, device, options: CollectorOptions | None = None):
        self.device = device
        self.options = options or CollectorOptions()
        self.on_gpu = is_cuda(device)
        self.host = HostCollector(self.options.python_heap, self.options.in_process, self.options.sample_period_s,
                                  stops_trace=not self.options.in_rank)
        self.cuda = self.sampler = self.cpu_tensors = None
        if self.on_gpu:
            from .sampler import DeviceSampler
            from .torch_cuda import CudaAllocatorCollector

            self.cuda = CudaAllocatorCollector(device)
            self.sampler = DeviceSampler(device, self.options.sample_period_s, shared=self.options.device_shared,
                                         nvml=not self.options.predicted)
        elif self.options.cpu_tensors:
            from .torch_cpu import CpuTensorCollector

            self.cpu_tensors = CpuTensorCollector()
        self.resident = None if self.on_gpu else ResidentReader()  # the timeline's host.rss, read each step
        self.timeline: list[dict] = []
        self._t0 = self._run_t0 = 0.0
        self.wall = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.host.start()
        if self.cuda:
            self.cuda.start()
            self.sampler.start()
        if self.cpu_tensors:
            self.cpu_tensors.start()

    def run_started(self) -> None:
        gc.collect()
        if self.cuda:
            self.cuda.run_started()
        self.host.run_started()
        self._run_t0 = time.perf_counter()
        self.step(0, phase="run")

    def step(self, step: int, **values) -> None:
        """Record one timeline point; stacks pass kv.bytes / kv.live_bytes they know."""
        point = {"t": round(time.perf_counter() - self._t0, 6), "step": step, **values}
        if self.sampler:
            s = self.sampler.sample(step)  # the allocator's counters; NVML is polled by a process of its own
            point.update({"gpu.allocated": s["gpu.allocated"], "gpu.reserved": s["gpu.reserved"]})
        else:
            point["host.rss"] = self.resident()
        self.timeline.append(point)

    def run_finished(self) -> None:
        self.wall = time.perf_counter() - self._run_t0
        self.host.run_finished()
        gc.collect()
        if self.cuda:
            self.cuda.run_finished()

    def stop(self) -> dict[str, MetricValue]:
        if self.wall is None:  # the run failed before finishing
            self.run_finished()
        metrics: dict[str, MetricValue] = {}
        if self.cpu_tensors:
            metrics.update(self.cpu_tensors.stop())
        elif not self.on_gpu:
            metrics["cpu.heap_alloc.peak"] = MetricValue.null(CPU_TENSORS_OFF)
        else:
            metrics["cpu.heap_alloc.peak"] = MetricValue.null(
                "measured on CPU runners only (the profiler would slow GPU runs)")
        if self.cuda:
            sampled = self.sampler.stop()
            metrics.update(self.cuda.stop(sampled.pop("gpu.fragmentation.peak")))
            metrics.update(sampled)
        else:
            for name in METRICS:
                if name.startswith("gpu."):
                    metrics[name] = MetricValue.null(NO_GPU)
        metrics.update(self.host.stop())
        if self.resident:
            self.resident.close()
        return metrics


