"""Run one round of one item in a fresh process, so each item's host metrics (RSS peak, faults) are its
own and a crash (segfault, OOM kill) takes down only that item. Invoked by runner.py.

    python -m memcheck.worker --file F --workload NAME --stack S --profile P --device D --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memcheck.worker")
    p.add_argument("--file", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--resolved", default=None, help="the workload as the runner resolved it (a pickle): read "
                   "instead of parsing --file again")
    p.add_argument("--stack", required=True)
    p.add_argument("--profile", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", required=True)
    p.add_argument("--rootdir", default=".")
    p.add_argument("--python-heap", action="store_true", help="trace the Python heap (tracemalloc)")
    p.add_argument("--cpu-tensors", action="store_true", help="record the CPU allocator's memory events")
    p.add_argument("--heap-in-warmup", action="store_true", help="trace the Python heap through a warm-up that is "
                   "the workload once (collect.CollectorOptions.heap_in_warmup)")
    p.add_argument("--sample-period-ms", type=float, default=10.0)
    p.add_argument("--device-shared", action="store_true", help="other items run on this GPU meanwhile: NVML "
                   "counts this process tree only (collect.CollectorOptions.device_shared)")
    p.add_argument("--predict", metavar="GPU", default=None, help="predict the item's GPU memory on this CPU runner "
                   "(fake CUDA tensors, the caching allocator modelled) for GPU, e.g. nvidia-h200")
    p.add_argument("--launched-at", type=float, default=None, help="time.time() when the runner started this round")
    # tensor-parallel ranks (memcheck.rank_workers starts one worker per rank)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--rendezvous", default=None, help="the round's rendezvous file, where the ranks meet")
    args = p.parse_args(argv)
    if args.world_size > 1 and not args.rendezvous:
        p.error("--world-size above 1 needs --rendezvous FILE")

    from . import project, stacks, workload
    from .errors import StackUnavailable, UsageError
    from .devices import resolve_device
    from .measure_round import measure
    from .measurement import Measurement
    from .metrics.collect import CollectorOptions
    from .states import ErrorKind, ItemError

    try:
        if args.resolved:
            with open(args.resolved, "rb") as f:
                wl = pickle.load(f)
        else:
            cfg = project.load(args.rootdir)
            found = [w for w in workload.load_file(args.file, args.profile, stacks.names(), cfg.thresholds)
                     if w.name == args.workload]
            if not found:
                raise UsageError(f"no workload named {args.workload!r}", args.file)
            wl = found[0]
        device = (None if args.predict else resolve_device(args.device) if args.world_size == 1
                  else _rank_device(args.device, args.rank))  # a tensor-parallel rank: its own GPU
    except (UsageError, StackUnavailable) as e:
        m = Measurement(args.workload, args.stack, args.file, args.profile)
        m.error = ItemError(ErrorKind.USAGE, str(e))
        _write(args.out, m)
        return 0
    options = CollectorOptions(python_heap=args.python_heap, cpu_tensors=args.cpu_tensors,
                               heap_in_warmup=args.heap_in_warmup, device_shared=args.device_shared,
                               sample_period_s=args.sample_period_ms / 1000)
    if args.predict:
        from .predict.item import predict

        _write(args.out, predict(wl, args.stack, args.predict, options, launched_at=args.launched_at))
        return 0
    if args.world_size > 1:  # one rank of a tensor-parallel item
        from . import rank_workers

        _write(args.out, rank_workers.measure_rank(wl, args.stack, device, options, args.rank, args.rendezvous))
        return 0
    _write(args.out, measure(wl, args.stack, device, options, launched_at=args.launched_at))
    return 0


def _rank_device(name: str, rank: int):
    """Rank R of a tensor-parallel item runs on cuda:R (never touching cuda:0 first), or on the CPU."""
    import torch

    from .devices import resolve_device

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and rank < torch.cuda.device_count():
        return resolve_device(f"cuda:{rank}")
    return resolve_device(name)  # too few GPUs: the stack's check() skips the item before any rank joins


def _write(path: str, m) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(m.to_json(), f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
