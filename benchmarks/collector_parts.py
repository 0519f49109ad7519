"""Which part of the default collectors costs a stack its speed on a GPU? One item, built and warmed up once in this
process, run repeatedly (interleaved) under: no collector; the NVML poller process alone (at 10 ms and at 100 ms);
the allocator reads at engine steps alone; all collectors; all collectors with the poller at 100 ms; all collectors
without the allocator reads at steps; no collector / the poller alone / all collectors with the allocator's cache
given back before the run (as the paged stack's timed run starts: its warm-up ends with the graph capture's
empty_cache, so every activation and vision-tower transient of the run is a cudaMalloc inside it); and the poller
reading the whole device's memory instead of each process's (the driver query it makes every 10 ms). Build and
warm-up time, the wall time of each run, then the table. The first run of the process is a "none" and so is the
last: their difference is what one-time work the warm-up left in the first run.

    .venv/bin/python benchmarks/collector_parts.py [--suite suites/r1_long_context.yaml] [--item r1-staggered-finish]
        [--stack hf] [--profile full] [--reps 1] [--device auto]

On a CPU only the variants without a GPU part run (none, all collectors): a check that the script runs. Not a test:
it prints the numbers.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from memcheck import project as config  # noqa: E402
from memcheck import stacks, workload  # noqa: E402
from memcheck.devices import is_cuda, resolve_device  # noqa: E402
from memcheck.metrics.collect import CollectorOptions, Collectors  # noqa: E402
from memcheck.metrics.sampler import DeviceSampler  # noqa: E402


class NullProbe:
    def step(self, step: int, **values) -> None:
        pass


class StepReads:
    """The allocator reads at engine steps alone: what Collectors.step reads on a GPU, nothing else."""

    def __init__(self, device):
        self.sampler = DeviceSampler(device)

    def step(self, step: int, **values) -> None:
        self.sampler.sample(step)


class NoStepReads(Collectors):
    """Every collector, but a step records its timeline point without the allocator's counters."""

    def step(self, step: int, **values) -> None:
        self.timeline.append({"t": round(time.perf_counter() - self._t0, 6), "step": step, **values})


# A pid no process can have (Linux caps pids at 2**22): NVML never reports it, so after its first poll the poller
# reads the whole device's memory (nvmlDeviceGetMemoryInfo) instead of each process's (GetComputeRunningProcesses).
NO_PROCESS = 2**22 + 1


def timed(stack, device, probe=None, collectors=None, poller_period=None, empty_cache=False,
          device_wide=False) -> float:
    import torch

    on_gpu = is_cuda(device)
    if empty_cache:
        torch.cuda.empty_cache()
    sampler = (DeviceSampler(device, poller_period, NO_PROCESS if device_wide else None) if poller_period
               else None)
    if sampler:
        sampler.start()
    if collectors:
        collectors.start()
        collectors.run_started()
    gc.collect()
    if on_gpu:
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    stack.run(collectors or probe or NullProbe())
    wall = time.perf_counter() - t
    if collectors:
        collectors.run_finished()
        collectors.stop()
    if sampler:
        sampler.stop()
    return wall


def variants(stack, device) -> dict:
    """name -> one timed run, in the order they run; on a CPU only those without a GPU part."""
    options = CollectorOptions(python_heap=False, cpu_tensors=False)
    slow = CollectorOptions(python_heap=False, cpu_tensors=False, sample_period_s=0.1)
    runs = {
        "none": lambda: timed(stack, device),
        "poller 10 ms only": lambda: timed(stack, device, poller_period=0.01),
        "poller 100 ms only": lambda: timed(stack, device, poller_period=0.1),
        "allocator reads at steps only": lambda: timed(stack, device, probe=StepReads(device)),
        "all collectors": lambda: timed(stack, device, collectors=Collectors(device, options)),
        "all collectors, poller 100 ms": lambda: timed(stack, device, collectors=Collectors(device, slow)),
        "all but allocator reads at steps": lambda: timed(stack, device, collectors=NoStepReads(device, options)),
        "none, cache given back": lambda: timed(stack, device, empty_cache=True),
        "poller 10 ms only, cache given back": lambda: timed(stack, device, poller_period=0.01, empty_cache=True),
        "all collectors, cache given back": lambda: timed(stack, device, collectors=Collectors(device, options),
                                                          empty_cache=True),
        "poller 10 ms device-wide only": lambda: timed(stack, device, poller_period=0.01, device_wide=True),
        "poller 10 ms device-wide, cache given back": lambda: timed(stack, device, poller_period=0.01,
                                                                    empty_cache=True, device_wide=True),
    }
    return runs if is_cuda(device) else {k: runs[k] for k in ("none", "all collectors")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="suites/r1_long_context.yaml")
    p.add_argument("--item", default="r1-staggered-finish")
    p.add_argument("--stack", default="hf")
    p.add_argument("--profile", default="full")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    wl = next(w for w in workload.load_file(os.path.join(ROOT, args.suite), args.profile, stacks.names(),
                                            config.load(ROOT).thresholds) if w.name == args.item)
    device = resolve_device(args.device)
    item = f"{args.item}[{args.stack}]"
    stack = stacks.load(args.stack)(wl, device)
    t = time.perf_counter()
    stack.prepare()
    build, t = time.perf_counter() - t, time.perf_counter()
    stack.warmup()
    print(f"{item} on {device}: build {build:.2f} s, warm-up {time.perf_counter() - t:.2f} s", flush=True)
    runs = variants(stack, device)
    walls: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(args.reps):
        order = list(runs) + ["none"] if rep == 0 else list(runs)
        for name in order:
            walls[name].append(runs[name]())
            print(f"{item} {name}: {walls[name][-1]:.2f} s", flush=True)
    base = statistics.median(walls["none"])
    print(f"\n{item}, {args.profile} profile, {device}, one process, built once; median wall per variant")
    for name, w in walls.items():
        print(f"  {name:44s} {statistics.median(w):7.2f} s  {100 * (statistics.median(w) - base) / base:+6.1f}%"
              f"  ({', '.join(f'{x:.2f}' for x in w)})")
    stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
