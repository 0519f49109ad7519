"""Which part of the default collectors costs a Python-bound stack its speed on a GPU? One item, built once in
this process, run repeatedly (interleaved) under: no collector; the NVML poller process alone (at 10 ms and at
100 ms); all collectors; all collectors with the poller at 100 ms. Wall time of each run, then the table.

    .venv/bin/python benchmarks/collector_parts.py [--suite suites/r1_long_context.yaml] [--item r1-staggered-finish]
        [--stack hf] [--profile full] [--reps 1]

Not a test: the numbers are for the closing note (benchmarks/results/collector_parts_*.log).
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

from harness import project as config  # noqa: E402
from harness import stacks, workload  # noqa: E402
from harness.devices import resolve_device  # noqa: E402
from harness.metrics.collect import CollectorOptions, Collectors  # noqa: E402
from harness.metrics.sampler import DeviceSampler  # noqa: E402


class NullProbe:
    def step(self, step: int, **values) -> None:
        pass


def timed(stack, device, probe=None, collectors=None, poller_period=None) -> float:
    import torch

    sampler = DeviceSampler(device, poller_period) if poller_period else None
    if sampler:
        sampler.start()
    if collectors:
        collectors.start()
        collectors.run_started()
    gc.collect()
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="suites/r1_long_context.yaml")
    p.add_argument("--item", default="r1-staggered-finish")
    p.add_argument("--stack", default="hf")
    p.add_argument("--profile", default="full")
    p.add_argument("--reps", type=int, default=1)
    args = p.parse_args()
    wl = next(w for w in workload.load_file(os.path.join(ROOT, args.suite), args.profile, stacks.names(),
                                            config.load(ROOT).thresholds) if w.name == args.item)
    device = resolve_device("cuda")
    stack = stacks.load(args.stack)(wl, device)
    stack.prepare()
    stack.warmup()
    options = CollectorOptions(python_heap=False, cpu_tensors=False)
    slow = CollectorOptions(python_heap=False, cpu_tensors=False, sample_period_s=0.1)
    variants = {
        "none": lambda: timed(stack, device),
        "poller 10 ms only": lambda: timed(stack, device, poller_period=0.01),
        "poller 100 ms only": lambda: timed(stack, device, poller_period=0.1),
        "all collectors (poller 10 ms)": lambda: timed(stack, device, collectors=Collectors(device, options)),
        "all collectors, poller 100 ms": lambda: timed(stack, device, collectors=Collectors(device, slow)),
    }
    walls: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(args.reps):
        order = list(variants) + ["none"] if rep == 0 else list(variants)
        for name in order:
            walls[name].append(variants[name]())
            print(f"{args.item}[{args.stack}] {name}: {walls[name][-1]:.2f} s", flush=True)
    base = statistics.median(walls["none"])
    print(f"\n{args.item}[{args.stack}], {args.profile} profile, one process, built once; median wall per variant")
    for name, w in walls.items():
        print(f"  {name:32s} {statistics.median(w):7.2f} s  {100 * (statistics.median(w) - base) / base:+6.1f}%"
              f"  ({', '.join(f'{x:.2f}' for x in w)})")
    stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
