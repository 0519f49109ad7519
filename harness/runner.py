"""Run one item: a fresh worker process per round, then baseline lookup, rules and verdict.

The plugin and the console script both go through here, so `pytest --memcheck` and
`memcheck baseline refresh` measure the same way.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from . import tensor_parallel
from .baselines import BaselineStore
from .errors import UsageError
from .measurement import Measurement
from .metrics.value import MetricValue
from .verdict import ItemResult, judge


@dataclass
class Settings:
    baselines: str = "baselines"
    profile: str | None = None
    device: str = "auto"
    update_baselines: bool = False
    strict: bool = False
    rootdir: str = "."
    python_heap: bool = True
    cpu_tensors: bool = True
    sample_period_ms: float = 10.0
    timeout_s: float | None = None


def measure_rounds(workload, stack: str, settings: Settings) -> Measurement:
    rounds = [_measure_in_worker(workload, stack, settings) for _ in range(workload.rounds)]
    first = rounds[0]
    failed = next((r for r in rounds if r.error or r.skipped), None)
    if failed:
        return failed
    if len(rounds) > 1:
        first.metrics = {name: MetricValue.from_rounds([r.metrics.get(name, MetricValue(None)) for r in rounds])
                         for name in first.metrics}
        first.rounds = len(rounds)
    if settings.python_heap or settings.cpu_tensors:
        first.metrics.update(memory_round(workload, stack, settings))
    return first


# Measured in the memory round, not in the timed rounds.
MEMORY_ROUND = ("host.heap_alloc.peak", "cpu.heap_alloc.peak")


def memory_round(workload, stack: str, settings: Settings) -> dict[str, MetricValue]:
    """host.heap_alloc.peak and cpu.heap_alloc.peak from a round of their own: tracemalloc traces every
    Python allocation (the paged stack decoded 3x slower under it on an H200) and the CPU allocator's
    memory events cost 5-12% of an allocation-heavy CPU run, so the timed rounds run without either and
    this round, the same workload in a fresh worker, runs with them (neither moves the other's bytes)."""
    m = _measure_in_worker(workload, stack, settings, memory_round=True)
    wanted = [n for n, on in zip(MEMORY_ROUND, (settings.python_heap, settings.cpu_tensors)) if on]
    if m.error or m.skipped:
        why = f"the memory round failed: {(m.error or {}).get('message') or m.skipped}"[:500]
        return {name: MetricValue.null(why) for name in wanted}
    taken = {name: m.metrics[name] for name in wanted}
    for value in taken.values():
        if value.value is not None:
            value.detail = f"{value.detail}, in a memory round of its own (the timed rounds run without it)"
    return taken


def _worker_command(workload, stack: str, s: Settings, out: str, memory_round: bool = False) -> list[str]:
    cmd = [_python(stack, s.rootdir), "-m", "harness.worker", "--file", workload.path, "--workload", workload.name,
           "--stack", stack, "--device", s.device, "--out", out, "--rootdir", s.rootdir,
           "--sample-period-ms", str(s.sample_period_ms)]
    if workload.profile:
        cmd += ["--profile", workload.profile]
    if not (memory_round and s.python_heap):  # tracemalloc and the CPU allocator's events: the memory round only
        cmd.append("--no-python-heap")
    if not (memory_round and s.cpu_tensors):
        cmd.append("--no-cpu-tensors")
    return cmd


def _measure_in_worker(workload, stack: str, s: Settings, memory_round: bool = False) -> Measurement:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_source_root(), os.environ.get("PYTHONPATH")]))}
    command = lambda out: _worker_command(workload, stack, s, out, memory_round)  # noqa: E731
    if workload.tensor_parallel > 1 and tensor_parallel.runs_ranks(stack):  # one worker per rank
        return tensor_parallel.measure_ranks(workload, stack, command,
                                             env, s.timeout_s, lambda rc, err: _death(rc) + _tail(err))
    fd, out = tempfile.mkstemp(prefix="memcheck-", suffix=".json")
    os.close(fd)
    cmd = command(out)
    m = Measurement(workload.name, stack, workload.path, workload.profile, workload.scaled, workload.digest())
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=s.timeout_s, env=env)
        if os.path.getsize(out):
            with open(out) as f:
                return Measurement.from_json(json.load(f))
        m.error = {"kind": "crash", "message": _death(proc.returncode) + _tail(proc.stderr)}
    except subprocess.TimeoutExpired as e:
        m.error = {"kind": "timeout", "message": f"no result after {s.timeout_s:g} s" + _tail(e.stderr)}
    finally:
        os.unlink(out)
    return m


def _python(stack: str, rootdir: str) -> str:
    """The worker's interpreter: the stack's own environment where it names one (vLLM's), else this one."""
    from . import stacks

    try:
        return getattr(stacks.load(stack), "worker_python", lambda _: None)(rootdir) or sys.executable
    except Exception:  # noqa: BLE001 - a stack that cannot even load reports why from inside the worker
        return sys.executable


def _source_root() -> str:
    # The worker must import this very harness, installed or run from a checkout.
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _death(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"the worker process died of {name}{hint}"
    return f"the worker process exited with status {returncode} without a result"


def _tail(stderr, lines: int = 6) -> str:
    if not stderr:
        return ""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    kept = [ln for ln in text.strip().splitlines() if not ln.startswith("USDT:")][-lines:]
    return ("; stderr: " + " | ".join(kept)) if kept else ""


def run_item(workload, stack: str, settings: Settings, store: BaselineStore | None = None) -> ItemResult:
    store = store or BaselineStore(settings.baselines)
    m = measure_rounds(workload, stack, settings)
    baseline, baseline_error = None, None
    device_class = m.environment.get("device_class")
    if device_class and not (m.error or m.skipped):
        try:
            baseline = store.load(device_class, m.workload, m.stack)
        except UsageError as e:
            baseline_error = str(e)
    result = judge(m, workload.thresholds, baseline, baseline_error)
    if settings.update_baselines and result.verdict not in ("error", "skipped"):
        path, changes = store.write(m)
        result.baseline_path = str(path)
        result.updated = changes
    elif result.verdict == "new" and settings.strict:
        result.strict = True
        result.reason += "; --memcheck-strict fails it: record one with --memcheck-update-baselines"
    return result
