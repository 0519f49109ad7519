"""What does the profiler behind cpu.heap_alloc.peak cost per operator? An op-bound loop (two small ops and
one allocation per iteration, one thread) with no profiler, with the allocator's memory events only (the
collector), and with torch.profiler.profile (every operator recorded too, as the collector was before);
rounds interleaved, min and median per iteration. Also checks both report the same peak.

    .venv/bin/python benchmarks/cpu_profiler_cost.py [ROUNDS]

Prints a table last. Not a test.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from memcheck.metrics.torch_cpu import CpuTensorCollector, peak_of  # noqa: E402

ITERATIONS = 20000


def work(x):
    y = x
    for _ in range(ITERATIONS):
        y = (y * 1.0001).add_(1e-6)


def timed(mode: str, x) -> tuple[float, int | None]:
    if mode == "memory events only":
        collector = CpuTensorCollector()
        collector.start()
    elif mode == "full profiler":
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        prof.__enter__()
    start = time.perf_counter()
    work(x)
    seconds = time.perf_counter() - start
    if mode == "memory events only":
        return seconds, collector.stop()["cpu.heap_alloc.peak"].value
    if mode == "full profiler":
        prof.__exit__(None, None, None)
        return seconds, peak_of(prof.profiler.kineto_results.experimental_event_tree())
    return seconds, None


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    torch.set_num_threads(1)
    x = torch.randn(16, 64)
    work(x)
    modes = ("no profiler", "memory events only", "full profiler")
    times, peaks = {m: [] for m in modes}, {m: set() for m in modes}
    for _ in range(rounds):
        for mode in modes:
            seconds, peak = timed(mode, x)
            times[mode].append(seconds * 1e6 / ITERATIONS)
            peaks[mode].add(peak)
    print(f"\n{ITERATIONS} iterations x {rounds} interleaved rounds, one thread; us per iteration")
    print(f"{'mode':20s} {'min':>7s} {'median':>7s}  cpu.heap_alloc.peak")
    for mode in modes:
        peak = sorted(peaks[mode], key=str)
        print(f"{mode:20s} {min(times[mode]):7.2f} {statistics.median(times[mode]):7.2f}  {peak}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
