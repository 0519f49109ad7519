"""How much do memcheck's collectors move the numbers they measure? Runs one workload in fresh worker
processes with each optional collector on and off, and prints the medians side by side.

    .venv/bin/python benchmarks/collector_overhead.py [WORKLOAD.yaml] [ROUNDS]

Prints a table last. Not a test: the numbers are for the closing note and the README.
"""
from __future__ import annotations

import statistics
import sys

from harness import config, stacks, units, workload
from harness.runner import Settings, _measure_in_worker

VARIANTS = {
    "all collectors": {},
    "no tracemalloc": {"python_heap": False},
    "no CPU-tensor profiler": {"cpu_tensors": False},
    "neither": {"python_heap": False, "cpu_tensors": False},
}
SHOWN = [("host.rss.peak", "bytes"), ("cpu.heap_alloc.peak", "bytes"), ("kv.bytes.peak", "bytes"),
         ("host.page_faults", "count"), ("time.wall", "s"), ("tokens_per_s", "tokens/s")]


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "suites/example.yaml"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    wl = workload.load_file(path, None, stacks.names(), config.load(".").thresholds)[0]
    results = {}
    for name, opts in VARIANTS.items():
        runs = [_measure_in_worker(wl, wl.stacks[0], Settings(**opts)) for _ in range(rounds)]
        results[name] = {metric: statistics.median(r.metrics[metric].value for r in runs
                                                   if r.metrics[metric].value is not None)
                         if any(r.metrics[metric].value is not None for r in runs) else None
                         for metric, _ in SHOWN}
        print(name, results[name], flush=True)
    rows = [("metric (median of %d)" % rounds, *VARIANTS)]
    for metric, unit in SHOWN:
        rows.append((metric, *(units.format_value(results[v][metric], unit) for v in VARIANTS)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"\nworkload {wl.name} [{wl.stacks[0]}], {rounds} rounds per variant, fresh process per round")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
