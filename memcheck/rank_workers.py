"""Tensor-parallel items (`tensor_parallel: N`): N rank processes per round, one Measurement.

The runner starts N workers at once (`python -m memcheck.worker ... --rank R --world-size N --rendezvous FILE`),
forked together from its fork server where it can, as it forks single-process rounds, for a
stack that shards its model across ranks itself (a class attribute `rank_processes = True`: the paged
stack). Each rank joins one torch.distributed group (gloo on the CPU, NCCL on CUDA with NVLink multicast
off) through a file of the round's own (torch.distributed's FileStore: a free port chosen by the runner could
be taken by another process before rank 0 bound it), runs on its own device (`cuda:R`) and measures itself with
the usual collectors in its own process. The ranks' Measurements merge into one: every metric is the maximum
across ranks under its usual name (the rank that would run out first), and `ranks` keeps each rank's
numbers for the report. On GPUs the item's device class names the GPU count (`nvidia-h200-x2`), so its
baselines live apart from single-GPU items'; the CPU ranks share one host, whose class stays. A rank that
dies takes the item to an `error` verdict, whose reason names the rank that failed first and the first line of
its error; the others are stopped.

Stacks with a tensor parallelism of their own (vllm) keep the single worker the runner always starts.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import tempfile
import time
import tracemalloc

from .measurement import Measurement
from .metrics.value import MetricValue
from .states import ErrorKind, ItemError

GRACE_S = 10.0  # how long the other ranks may take to finish once one rank has stopped
COLLECTIVE_TIMEOUT_S = 300.0  # a collective waiting longer than this for a peer fails the rank
FAULT_ENV = "MEMCHECK_TP_FAULT_RANK"  # fault injection for the tests: this rank kills itself after joining


def runs_ranks(stack: str) -> bool:
    """Whether the stack runs one process per rank (it shards the model itself through torch.distributed)."""
    from . import stacks

    try:
        return stacks.load(stack).rank_processes
    except Exception:  # noqa: BLE001 - a stack that cannot load says why from inside its worker
        return False


# -- the runner's side ------------------------------------------------------------------------------
def fresh_interpreters(cmds: list[list[str]], logs: list[str], env: dict) -> list[subprocess.Popen]:
    """The rank workers as fresh interpreters, each one's stderr to its log."""
    procs = []
    for cmd, log in zip(cmds, logs):
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, env=env))
    return procs


def measure_ranks(workload, stack: str, command, env: dict, timeout_s: float | None, describe_death,
                  start=fresh_interpreters) -> Measurement:
    """One round of a tensor-parallel item: start the N rank workers, wait, merge their Measurements.

    command(out_path) -> the worker command line (without the rank arguments); describe_death(returncode,
    stderr) -> why a worker ended without a result; start(commands, logs, env) -> Popen-like processes (the
    runner forks them from its fork server where it can)."""
    n = workload.tensor_parallel
    round_dir = tempfile.mkdtemp(prefix="memcheck-tp-")  # the round's results, logs and rendezvous file
    rendezvous = os.path.join(round_dir, "rendezvous")  # FileStore: no port, so no other process can take it
    env = {**env, "NCCL_NVLS_ENABLE": "0"}
    outs = [os.path.join(round_dir, f"rank{rank}.json") for rank in range(n)]
    logs = [os.path.join(round_dir, f"rank{rank}.log") for rank in range(n)]
    procs = []
    try:
        for path in (*outs, *logs):
            open(path, "w").close()  # a result: empty until the worker writes it
        procs = start([command(out) + ["--rank", str(rank), "--world-size", str(n), "--rendezvous", rendezvous]
                       for rank, out in enumerate(outs)], logs, env)
        timed_out, first, stopped = _wait(procs, outs, timeout_s)
        measured, failures = {}, {}
        for rank, (proc, out, log) in enumerate(zip(procs, outs, logs)):
            if os.path.getsize(out):
                with open(out) as f:
                    measured[rank] = Measurement.from_json(json.load(f))
                if measured[rank].error:
                    failures[rank] = _first_line(measured[rank].error.message)
            elif rank in stopped:
                failures[rank] = (f"no result after {timeout_s:g} s" if timed_out
                                  else f"stopped {GRACE_S:g} s after rank {first} failed")
            else:
                with open(log, "rb") as f:
                    failures[rank] = describe_death(proc.returncode, _error_line(f.read()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(round_dir, ignore_errors=True)
    if not failures:
        m = merge([measured[r] for r in range(n)])  # a rank's skip is the item's
        m.notes.insert(min(1, len(m.notes)), f"rank workers: {getattr(procs[0], 'started', 'fresh interpreters')}")
        return m
    # The rank that failed first leads: the others' errors (a peer closed the connection) follow from it.
    first = first if first in failures else min(failures)
    m = measured[first] if first in measured else Measurement.of_item(workload, stack)
    kind = ErrorKind.TIMEOUT if timed_out else m.error.kind if m.error else ErrorKind.CRASH
    m.error = ItemError(kind, f"{len(failures)} of {n} tensor-parallel ranks failed: "
                        + "; ".join(f"rank {r}: {failures[r]}" for r in sorted(failures, key=lambda r: r != first)))
    return m


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _error_line(stderr: bytes) -> str:
    """The first line of the exception a worker's traceback ends with (its frames left out), else stderr's last
    line: one line that says why, where the traceback's tail would crowd out the other ranks' reasons."""
    lines = [ln for ln in stderr.decode(errors="replace").splitlines() if ln.strip() and not ln.startswith("USDT:")]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    if starts:  # the last traceback is the exception that ended the process; its frames are indented
        raised = [ln for ln in lines[starts[-1] + 1:] if not ln.startswith((" ", "\t"))]
        if raised:
            return raised[0]
    return lines[-1] if lines else ""


def _wait(procs, outs, timeout_s: float | None) -> tuple[bool, int | None, set[int]]:
    """Wait for every rank. Once one has failed (no result, or an error), give the rest GRACE_S and stop them:
    a rank that died leaves its peers blocked in a collective. Returns whether the round's timeout ran out, the
    rank seen failing first (None if none was seen while others ran) and the ranks stopped here."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    first = None
    failed_at = None
    while None in [p.poll() for p in procs]:  # poll every rank: any() would stop at the first one running
        now = time.monotonic()
        if failed_at is None:
            first = next((r for r, (p, out) in enumerate(zip(procs, outs))
                          if p.returncode is not None and _failed(p, out)), None)
            failed_at = now if first is not None else None
        if deadline and now > deadline:
            return True, first, _stop(procs)
        if failed_at is not None and now - failed_at > GRACE_S:
            return False, first, _stop(procs)
        time.sleep(0.05)
    return False, first, set()


def _failed(proc, out: str) -> bool:
    if proc.returncode != 0 or not os.path.getsize(out):
        return True
    try:
        with open(out) as f:
            return bool(json.load(f).get("error"))
    except (OSError, ValueError):
        return True


def _stop(procs) -> set[int]:
    """Kill the ranks still running; returns them."""
    running = {r for r, p in enumerate(procs) if p.poll() is None}
    for r in running:
        procs[r].kill()
    for p in procs:
        p.wait()
    return running


def merge(ranks: list[Measurement]) -> Measurement:
    """One Measurement from the ranks': each metric the maximum across ranks (null only where every rank is
    null), floors the largest rank's, rank 0's environment, timeline and notes, and `ranks` with each rank's
    numbers. A rank's error or skip is the item's."""
    first = ranks[0]
    failed = next((m for m in ranks if m.error), None)
    if failed is not None:
        r = ranks.index(failed)
        failed.error = ItemError(failed.error.kind, f"rank {r}: {failed.error.message}")
        return failed
    skipped = next((m for m in ranks if m.skipped), None)
    if skipped is not None:
        return skipped
    per_rank = [{"rank": r, "metrics": {k: v.value for k, v in sorted(m.metrics.items())}}
                for r, m in enumerate(ranks)]
    names = sorted({name for m in ranks for name in m.metrics})
    merged = {}
    for name in names:
        values = [m.metrics.get(name, MetricValue.null("not reported by this rank")) for m in ranks]
        measured = [(v.value, v) for v in values if v.value is not None]
        if not measured:
            merged[name] = values[0]
            continue
        top = max(measured, key=lambda pair: pair[0])[1]
        detail = "maximum across ranks" + (f"; {top.detail}" if top.detail else "")
        merged[name] = MetricValue(top.value, detail=detail)
    first.metrics = merged
    if first.environment.get("gpu"):  # N GPUs of that class: its baselines are not those of one GPU's items
        first.environment["device_class"] = f"{first.environment['device_class']}-x{len(ranks)}"
    first.floors = {k: max(m.floors.get(k, 0) for m in ranks) for k in first.floors}
    first.ranks = per_rank
    first.notes = [f"tensor parallel over {len(ranks)} ranks: each metric is the maximum across ranks, "
                   "per-rank values under `ranks`"] + first.notes
    return first


# -- the rank's side (inside memcheck.worker) --------------------------------------------------------
def measure_rank(workload, stack: str, device, options, rank: int, rendezvous: str) -> Measurement:
    """One rank's round: the stack's check() first (every rank decides alike, so a skip joins no group), then
    join the group, measure with this process's collectors, leave."""
    from . import stacks
    from .measure_round import measure

    try:
        stacks.load(stack).check(workload, device)
    except Exception:  # noqa: BLE001 - measure() reports the skip (or the failure) as it always does
        return measure(workload, stack, device, options)
    init_rank(rank, workload.tensor_parallel, rendezvous, device)
    latent = bool(workload.model_config().get("kv_lora_rank"))
    options = dataclasses.replace(options, in_rank=True)
    return finish_rank(measure(workload, stack, device, options), workload.tensor_parallel, latent)


def init_rank(rank: int, world_size: int, rendezvous: str, device):
    """Join the group (gloo on the CPU, NCCL on CUDA) on this rank's device (the worker resolved cuda:rank),
    meeting the other ranks in the round's rendezvous file (a FileStore; NCCL exchanges its id through it)."""
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as the device docs require
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=f"file://{rendezvous}",
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S), **kwargs)
    if os.environ.get(FAULT_ENV) == str(rank):
        os.kill(os.getpid(), 9)  # a rank that dies mid-run (test hook): its peers block in a collective
    return device


def finish_rank(m: Measurement, world_size: int, latent_replicated: bool = False) -> Measurement:
    """Per-rank floors: the KV floor of the rank's share of the KV heads, or the whole latent cache for MLA
    (every rank holds the whole latent, as serving engines do); the weights floor is already the rank's
    shard plus what it holds whole, measured off its tensors. Leave the group."""
    import torch.distributed as dist

    if "kv" in m.floors and latent_replicated:
        m.notes.append("KV floor per rank: the whole latent cache (MLA's latent is replicated on every rank)")
    elif "kv" in m.floors:
        m.floors["kv"] //= world_size
        if "weights" in m.floors:
            m.floors["weights+kv"] = m.floors["weights"] + m.floors["kv"]
    if dist.is_initialized():
        dist.destroy_process_group()  # joins the group's threads: none is left to race the trace's stop
    tracemalloc.stop()  # the heap trace a rank's collectors left running (CollectorOptions.in_rank)
    return m
