"""What do memcheck's default collectors cost? For every suite item: the timed round exactly as `pytest
--memcheck` runs it (default collectors) against a control with no collector at all (the same stack,
prepared and warmed up the same way, its run timed the same way, probe calls ignored), each in a fresh
process, rounds interleaved (alternating which goes first) so load on a shared machine hits both alike;
medians of the rounds. Memory: every memory metric against the committed baseline of this device class
(identical where the metric is exact), with the memory round (host.heap_alloc.peak and
cpu.heap_alloc.peak, in a worker of its own) timed beside.

    .venv/bin/python benchmarks/collector_overhead.py [--rounds 3] [--stacks hf,paged] [--device auto]
        [--profile ci|full] [--items NAME,...] [--no-memory-round] [--time-limit S] [SUITE.yaml ...]
    (default: every item of every suite in suites/, the ci profile on a CPU, full on a GPU)

--time-limit starts no new item after S seconds, so a capped call (a GPU lease) still ends with its
table. Prints one line per round as it goes and the table last. Not a test: the numbers are for the
closing note and the README; timing on a shared machine is noisy, and the control says how noisy.
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from memcheck import environment, stacks, units, workload  # noqa: E402
from memcheck import project as config  # noqa: E402
from memcheck.baselines import BaselineStore  # noqa: E402
from memcheck.metrics.catalog import METRICS  # noqa: E402
from memcheck.metrics.value import MetricValue  # noqa: E402
from memcheck.measurement import Measurement  # noqa: E402
from memcheck.runner import MEMORY_ROUND, Settings, memory_round  # noqa: E402

# Exact by construction: these must equal the committed baseline to the byte. (kv.page_footprint is exact
# for the addresses a run got, but where malloc puts the cache moves it by a page or two: shown as a change.)
EXACT = ("cpu.heap_alloc.peak", "kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak", "kv.blocks_unreclaimed",
         "gpu.heap_alloc.peak", "gpu.heap_alloc.end", "gpu.reserved.peak")
MEMORY = [n for n, s in METRICS.items() if s.unit in ("bytes", "count", "ratio")]


class NullProbe:
    def step(self, step: int, **values) -> None:
        pass


def control(path: str, name: str, stack_name: str, device: str, profile: str) -> dict:
    """The no-collector control, in this (fresh) process: prepare, warm up, run, timed as measure() times."""
    import torch

    from memcheck.devices import resolve_device

    wl = _load(path, profile, name)
    dev = resolve_device(device)
    stack_cls = stacks.load(stack_name)
    stack_cls.check(wl, dev)  # its imports (and the model class's), outside the build, as measure() does
    if stack_cls.attentions:
        stack_cls.check_attention(stack_cls.attentions[0], wl, dev)
    stack = stack_cls(wl, dev)
    t0 = time.perf_counter()
    stack.prepare()
    t1 = time.perf_counter()
    stack.warmup()
    phases = {"build": round(t1 - t0, 3), "warmup": round(time.perf_counter() - t1, 3)}
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    start, cpu = time.perf_counter(), time.process_time()
    result = stack.run(NullProbe())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    stack.close()
    return {"time.wall": wall, "tokens_per_s": result.metrics["tokens_per_s"].value, "cpu_s": cpu, "phases": phases}


def collected(path: str, name: str, stack_name: str, device: str, profile: str) -> dict:
    """The timed round as the harness's worker runs it (default collectors; tracemalloc and the CPU allocator's
    events are the memory round's), in this (fresh) process, plus the CPU time of the run: on a shared machine
    it moves less than wall time when other work takes the cores."""
    from memcheck.devices import resolve_device
    from memcheck.measure_round import measure
    from memcheck.metrics import collect

    started, finished, cpu = collect.Collectors.run_started, collect.Collectors.run_finished, {}
    collect.Collectors.run_started = lambda self: (started(self), cpu.setdefault("t0", time.process_time()))
    collect.Collectors.run_finished = lambda self: (cpu.setdefault("t1", time.process_time()), finished(self))
    m = measure(_load(path, profile, name), stack_name, resolve_device(device),
                collect.CollectorOptions(python_heap=False, cpu_tensors=False))
    return {"measurement": m.to_json(), "cpu_s": cpu["t1"] - cpu["t0"] if "t1" in cpu else None}


def _load(path: str, profile: str, name: str):
    loaded = workload.load_file(path, profile, stacks.names(), config.load(ROOT).thresholds)
    return next(w for w in loaded if w.name == name)


def _in_worker(mode: str, wl, stack: str, device: str) -> dict:
    cmd = [sys.executable, __file__, mode, wl.path, wl.name, stack, "--device", device, "--profile", wl.profile or "ci"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return {"failed": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def _phases(phases: dict) -> str:
    """Build and warm-up seconds of one process: a first process on a fresh machine reads cold library pages."""
    return f"{phases.get('build', float('nan')):.2f}/{phases.get('warmup', float('nan')):.2f} s"


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _memory_vs_baseline(runs, baseline) -> str:
    """'exact N/N' for the exact metrics, then the host metrics' change, against the committed baseline."""
    if baseline is None:  # no committed baseline here (a GPU runner): do the rounds agree with each other?
        measured = [n for n in EXACT if runs[0].metrics[n].value is not None]
        same = [n for n in measured if len({r.metrics[n].value for r in runs}) == 1]
        return f"no baseline; rounds agree on {len(same)}/{len(measured)} exact metrics"
    exact = [n for n in EXACT if n in baseline.metrics and baseline.metrics[n].value is not None]
    same = [n for n in exact if all(r.metrics[n].value == baseline.metrics[n].value for r in runs)]
    text = f"exact {len(same)}/{len(exact)}"
    differ = sorted(set(exact) - set(same))  # with the values: how far, and whether every round moved alike
    if differ:
        moved = [f"{n} {baseline.metrics[n].value:g} -> " + "/".join(f"{r.metrics[n].value:g}" for r in runs)
                 for n in differ]
        text += f" (differ: {', '.join(moved)})"
    pages, was = runs[0].metrics["kv.page_footprint"].value, baseline.metrics.get("kv.page_footprint")
    if pages is not None and was is not None and was.value is not None:
        text += f", pages {was.value:g}->{pages:g}"
    for name, short in (("host.rss.peak", "rss"), ("host.page_faults", "faults")):
        now, then = _median([r.metrics[name].value for r in runs]), baseline.metrics.get(name)
        if now is not None and then is not None and then.value:
            text += f", {short} {100 * (now - then.value) / then.value:+.1f}%"
    return text


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("suites", nargs="*")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stacks", default="hf,paged")
    p.add_argument("--device", default="auto")
    p.add_argument("--profile", default=None)
    p.add_argument("--items", default=None, help="only these workloads (comma-separated names), in this order")
    p.add_argument("--no-memory-round", action="store_true", help="skip the memory round")
    p.add_argument("--time-limit", type=float, default=None, help="start no new item after this many seconds")
    p.add_argument("--control", nargs=3, metavar=("FILE", "WORKLOAD", "STACK"), help="(internal) one control run")
    p.add_argument("--collected", nargs=3, metavar=("FILE", "WORKLOAD", "STACK"), help="(internal) one timed round")
    args = p.parse_args()
    if args.control or args.collected:
        run = control if args.control else collected
        print(json.dumps(run(*(args.control or args.collected), args.device, args.profile)))
        return 0
    import torch

    on_gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    profile = args.profile or ("full" if on_gpu else "ci")
    settings = Settings(profile=profile, device=args.device, rootdir=ROOT, baselines=os.path.join(ROOT, "baselines"))
    store = BaselineStore(settings.baselines)
    device_class = environment.device_class(torch.device("cuda" if on_gpu else "cpu"))
    wanted = args.stacks.split(",")
    items = [(wl, stack) for path in args.suites or sorted(glob.glob(os.path.join(ROOT, "suites", "*.yaml")))
             for wl in workload.load_file(path, profile, stacks.names(), config.load(ROOT).thresholds)
             for stack in wanted if stack in wl.stacks]
    if args.items:
        names = args.items.split(",")
        items = sorted([i for i in items if i[0].name in names], key=lambda i: names.index(i[0].name))
    rows, started = [], time.perf_counter()
    for wl, stack in items:
        if args.time_limit and time.perf_counter() - started > args.time_limit:
            rows.append((f"{wl.name}[{stack}]", *(["-"] * 8), f"not run: past --time-limit {args.time_limit:g} s"))
            continue
        rows.append(_item(wl, stack, settings, store, device_class, args.rounds, not args.no_memory_round))
    header = ("item", "wall on", "wall off", "wall +%", "tok/s on", "tok/s off", "tok/s -%", "cpu +%", "memory round",
              "memory vs baseline")
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print(f"\n{device_class}, profile {profile}, medians of {args.rounds} interleaved rounds, fresh process each; "
          f"on = default collectors (timed round), off = no collector (control)")
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return 0


def _item(wl, stack: str, settings: Settings, store: BaselineStore, device_class: str, rounds: int,
          with_memory: bool) -> tuple:
    item = f"{wl.name}[{stack}]"
    on, off, cpu_on = [], [], []
    for i in range(rounds):
        first_control = i % 2 == 1  # alternate which runs first: load that drifts hits both alike
        c = _in_worker("--control", wl, stack, settings.device) if first_control else None
        out = _in_worker("--collected", wl, stack, settings.device)
        m = None if "failed" in out else Measurement.from_json(out["measurement"])
        if m is None or m.skipped or m.error:
            why = (m.skipped or m.error["message"]) if m else out["failed"]
            print(item, "skipped" if m and m.skipped else "error", why, flush=True)
            return (item, *(["-"] * 8), ("skipped: " + m.skipped if m and m.skipped else "error")[:60])
        c = c or _in_worker("--control", wl, stack, settings.device)
        if "failed" in c:
            print(item, "control failed:", c["failed"], flush=True)
            return (item, *(["-"] * 8), "control failed")
        on.append(m)
        off.append(c)
        cpu_on.append(out["cpu_s"])
        print(item, f"round {i + 1}: on wall {m.metrics['time.wall'].value:.3f} s, cpu {out['cpu_s']:.3f} s, "
                    f"{m.metrics['tokens_per_s'].value:.2f} tok/s; off wall {c['time.wall']:.3f} s, "
                    f"cpu {c['cpu_s']:.3f} s, {c['tokens_per_s']:.2f} tok/s; {'off' if first_control else 'on'} first; "
                    f"build/warm-up on {_phases(m.phases)}, off {_phases(c['phases'])}; "
                    f"gpu.device_used.peak {m.metrics['gpu.device_used.peak'].value}, "
                    f"gpu.fragmentation.peak {m.metrics['gpu.fragmentation.peak'].value}", flush=True)
    start = time.perf_counter()
    if with_memory:
        memory_round(wl, stack, settings, on[0])
    memory_metrics = {name: on[0].metrics[name] for name in MEMORY_ROUND if with_memory and name in on[0].metrics}
    memory_s = f"{time.perf_counter() - start:.1f} s" if with_memory else "not run"
    for m in on:
        m.metrics.update(memory_metrics)
    heap = memory_metrics.get("host.heap_alloc.peak", MetricValue.null("not run"))
    wall_on, wall_off = _median(m.metrics["time.wall"].value for m in on), _median(c["time.wall"] for c in off)
    tps_on, tps_off = _median(m.metrics["tokens_per_s"].value for m in on), _median(c["tokens_per_s"] for c in off)
    cpu_on_s, cpu_off_s = _median(cpu_on), _median(c["cpu_s"] for c in off)
    baseline = store.load(device_class, wl.name, stack)
    memory = _memory_vs_baseline(on, baseline)
    if baseline and heap.value is not None and baseline.metrics.get("host.heap_alloc.peak"):
        was = baseline.metrics["host.heap_alloc.peak"].value
        memory += f", heap {100 * (heap.value - was) / was:+.1f}%" if was else ""
    return (item, units.format_value(wall_on, "s"), units.format_value(wall_off, "s"),
            f"{100 * (wall_on - wall_off) / wall_off:+.1f}", f"{tps_on:.2f}", f"{tps_off:.2f}",
            f"{100 * (tps_off - tps_on) / tps_off:+.1f}", f"{100 * (cpu_on_s - cpu_off_s) / cpu_off_s:+.1f}",
            memory_s, memory)


if __name__ == "__main__":
    sys.exit(main())
