"""Tensor-parallel items (`tensor_parallel: N`): N rank processes per round, one Measurement.

The runner starts N workers (`python -m harness.worker ... --rank R --world-size N --master-port P`) for a
stack that shards its model across ranks itself (a class attribute `rank_processes = True`: the paged
stack). Each rank joins one torch.distributed group (gloo on the CPU, NCCL on CUDA with NVLink multicast
off, rendezvous on a free 127.0.0.1 port), runs on its own device (`cuda:R`) and measures itself with the
usual collectors in its own process. The ranks' Measurements merge into one: every metric is the maximum
across ranks under its usual name (the rank that would run out first), and `ranks` keeps each rank's
numbers for the report. On GPUs the item's device class names the GPU count (`nvidia-h200-x2`), so its
baselines live apart from single-GPU items'; the CPU ranks share one host, whose class stays. A rank that
dies takes the item to an `error` verdict; the others are stopped.

Stacks with a tensor parallelism of their own (vllm) keep the single worker the runner always starts.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import tempfile
import time

from .measurement import Measurement
from .metrics.value import MetricValue
from .states import ErrorKind, ItemError

LOOPBACK = "127.0.0.1"
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# -- the runner's side ------------------------------------------------------------------------------
def measure_ranks(workload, stack: str, command, env: dict, timeout_s: float | None, describe_death) -> Measurement:
    """One round of a tensor-parallel item: start the N rank workers, wait, merge their Measurements.

    command(out_path) -> the worker command line (without the rank arguments); describe_death(returncode,
    stderr) -> why a worker ended without a result."""
    n = workload.tensor_parallel
    port = free_port()
    env = {**env, "NCCL_NVLS_ENABLE": "0", "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)}
    outs, procs, logs = [], [], []
    try:
        for rank in range(n):
            fd, out = tempfile.mkstemp(prefix=f"memcheck-rank{rank}-", suffix=".json")
            os.close(fd)
            outs.append(out)
            log = tempfile.TemporaryFile()
            logs.append(log)
            cmd = command(out) + ["--rank", str(rank), "--world-size", str(n), "--master-port", str(port)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env))
        timed_out = _wait(procs, outs, timeout_s)
        measured, failures = [], []
        for rank, (proc, out, log) in enumerate(zip(procs, outs, logs)):
            if os.path.getsize(out):
                with open(out) as f:
                    measured.append(Measurement.from_json(json.load(f)))
                continue
            log.seek(0)
            stderr = log.read()
            why = (f"no result after {timeout_s:g} s" if timed_out and proc.returncode in (-9, -15)
                   else describe_death(proc.returncode, stderr))
            failures.append(f"rank {rank}: {why}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        for out in outs:
            os.unlink(out)
    if failures or len(measured) != n:
        m = Measurement.of_item(workload, stack)
        m.error = ItemError(ErrorKind.TIMEOUT if timed_out else ErrorKind.CRASH,
                            f"{len(failures)} of {n} tensor-parallel ranks ended without a result: "
                            + "; ".join(failures))
        rank_errors = [f"rank {r}: {x.error.message}" for r, x in enumerate(measured) if x.error]
        if rank_errors:
            m.notes.append("the other ranks: " + "; ".join(rank_errors))
        return m
    return merge(measured)


def _wait(procs, outs, timeout_s: float | None) -> bool:
    """Wait for every rank. Once one has failed (no result, or an error), give the rest GRACE_S and stop them:
    a rank that died leaves its peers blocked in a collective. True if the round's timeout ran out."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.returncode is not None and _failed(p, out) for p, out in zip(procs, outs)):
            failed_at = now
        if deadline and now > deadline:
            _stop(procs)
            return True
        if failed_at is not None and now - failed_at > GRACE_S:
            _stop(procs)
            return False
        time.sleep(0.05)
    return False


def _failed(proc, out: str) -> bool:
    if proc.returncode != 0 or not os.path.getsize(out):
        return True
    try:
        with open(out) as f:
            return bool(json.load(f).get("error"))
    except (OSError, ValueError):
        return True


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


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


# -- the rank's side (inside harness.worker) --------------------------------------------------------
def measure_rank(workload, stack: str, device, options, rank: int, port: int) -> Measurement:
    """One rank's round: the stack's check() first (every rank decides alike, so a skip joins no group), then
    join the group, measure with this process's collectors, leave."""
    from . import stacks
    from .measure_round import measure

    try:
        stacks.load(stack).check(workload, device)
    except Exception:  # noqa: BLE001 - measure() reports the skip (or the failure) as it always does
        return measure(workload, stack, device, options)
    init_rank(rank, workload.tensor_parallel, port, device)
    latent = bool(workload.model_config().get("kv_lora_rank"))
    return finish_rank(measure(workload, stack, device, options), workload.tensor_parallel, latent)


def init_rank(rank: int, world_size: int, port: int, device):
    """Join the group (gloo on the CPU, NCCL on CUDA) on this rank's device (the worker resolved cuda:rank)."""
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as the device docs require
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = LOOPBACK, str(port)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=f"tcp://{LOOPBACK}:{port}",
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
        dist.destroy_process_group()
    return m
