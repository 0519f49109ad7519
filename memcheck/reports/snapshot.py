"""The torch allocator snapshot of an item that regressed on a CUDA runner: a pickle for
https://pytorch.org/memory_viz, saved as an artifact and linked from the reports.

The measured run stays clean (recording allocator history costs time and host memory, which would move
the very numbers being gated): when an item regresses, it runs once more in a fresh process with
`torch.cuda.memory._record_memory_history` on, and `_dump_snapshot` writes the pickle, alloc/free stack
traces included. Workloads are seeded, so the rerun allocates as the gated run did.

    python -m memcheck.reports.snapshot --file F --workload NAME --stack S --device D --out OUT.pickle
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

MAX_ENTRIES = 100_000  # alloc/free events kept (a ring buffer): enough for a decode loop's steady state
NOT_CUDA = 3  # exit status of the worker when there is no CUDA device


def wanted(result) -> bool:
    """A regressed item measured on a GPU (its environment names the GPU)."""
    return result.verdict == "regressed" and bool(result.measurement.environment.get("gpu"))


def path_for(directory: str, workload: str, stack: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{workload}-{stack}")
    return os.path.join(directory, f"{name}.pickle")


def capture(workload, stack: str, settings, directory: str) -> tuple[str | None, str]:
    """Rerun the item with allocator history on; returns (pickle path or None, what happened)."""
    out = path_for(directory, workload.name, stack)
    os.makedirs(directory, exist_ok=True)
    cmd = [sys.executable, "-m", "memcheck.reports.snapshot", "--file", workload.path, "--workload", workload.name,
           "--stack", stack, "--device", settings.device, "--rootdir", settings.rootdir, "--out", out]
    if workload.profile:
        cmd += ["--profile", workload.profile]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=settings.timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"allocator snapshot: no result after {settings.timeout_s:g} s"
    if proc.returncode == 0 and os.path.exists(out):
        return out, f"allocator snapshot saved to {out}"
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    return None, f"allocator snapshot not saved (status {proc.returncode}): {tail}"


def record(run, out: str, memory) -> None:
    """Run `run()` with allocator history recorded, then dump the snapshot, whatever the run did."""
    memory._record_memory_history(max_entries=MAX_ENTRIES)
    try:
        run()
    finally:
        try:
            memory._dump_snapshot(out)
        finally:
            memory._record_memory_history(enabled=None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memcheck.reports.snapshot")
    for flag in ("--file", "--workload", "--stack", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--profile", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--rootdir", default=".")
    args = p.parse_args(argv)

    import torch

    from .. import project, stacks, workload
    from ..devices import resolve_device
    from ..measure_round import measure
    from ..metrics.collect import CollectorOptions

    if not torch.cuda.is_available():
        print("no CUDA device on this runner: no allocator snapshot", file=sys.stderr)
        return NOT_CUDA
    device = resolve_device(args.device)
    if device.type != "cuda":
        print(f"device {device} is not CUDA: no allocator snapshot", file=sys.stderr)
        return NOT_CUDA
    cfg = project.load(args.rootdir)
    found = [w for w in workload.load_file(args.file, args.profile, stacks.names(), cfg.thresholds)
             if w.name == args.workload]
    if not found:
        print(f"{args.file}: no workload named {args.workload!r}", file=sys.stderr)
        return 2
    options = CollectorOptions(python_heap=False)  # tracemalloc would only slow the rerun down
    tmp = f"{args.out}.tmp"
    record(lambda: measure(found[0], args.stack, device, options), tmp, torch.cuda.memory)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
