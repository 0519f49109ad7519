"""The runner's side of a tensor-parallel round (memcheck.rank_workers.measure_ranks) with small stand-in rank
workers: each round's group meets in a rendezvous file of its own, removed afterwards (a port chosen ahead could
be taken by another process before rank 0 bound it), and a failed round's reason names the rank that failed
first and the first line of its error, without a traceback."""
import os
import sys
import threading
import types

import torch

from memcheck import rank_workers
from memcheck.runner import _death, _tail

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
WORKLOAD = types.SimpleNamespace(tensor_parallel=2, name="w", path="w.yaml", profile=None, scaled=False,
                                 digest=lambda _: "")

# A rank: join the group through init_rank, all-reduce tag * 10 + rank, write the sum and the rendezvous file.
JOIN = """
import argparse, os, sys, torch, torch.distributed as dist
from memcheck.measurement import Measurement
from memcheck.metrics.value import MetricValue
from memcheck.rank_workers import init_rank
p = argparse.ArgumentParser()
for a in ("out", "tag", "--rank", "--world-size", "--rendezvous"):
    p.add_argument(a)
a = p.parse_args(sys.argv[1:])
init_rank(int(a.rank), int(a.world_size), a.rendezvous, torch.device("cpu"))
t = torch.tensor([int(a.tag) * 10 + int(a.rank)])
dist.all_reduce(t)
m = Measurement("w", "stand-in", metrics={"sum": MetricValue(int(t))}, notes=[a.rendezvous])
open(a.out, "w").write(__import__("json").dumps(m.to_json()))
dist.destroy_process_group()
"""

# Rank 1 fails with a two-line error before joining; rank 0 waits for it as a peer in a collective would.
FAIL = """
import sys, time
if sys.argv[sys.argv.index("--rank") + 1] == "1":
    raise RuntimeError("the store could not be reached\\nsecond line of the message")
time.sleep(60)
"""


def describe_death(returncode, stderr):  # what the runner passes (harness.runner._measure_in_worker)
    return _death(returncode) + _tail(stderr)


def test_two_rounds_at_once_meet_in_rendezvous_files_of_their_own_removed_afterwards():
    results = {}

    def round_(tag):
        command = lambda out: [sys.executable, "-c", JOIN, out, str(tag)]  # noqa: E731
        results[tag] = rank_workers.measure_ranks(WORKLOAD, "stand-in", command, ENV, 120, describe_death)

    threads = [threading.Thread(target=round_, args=(tag,)) for tag in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for tag, m in results.items():
        assert m.error is None, m.error
        assert m.metrics["sum"].value == 2 * tag * 10 + 1  # each group reduced over its own two ranks only
    files = [m.notes[-1] for m in results.values()]
    assert files[0] != files[1] and all(os.path.isabs(f) for f in files)
    assert not any(os.path.exists(f) or os.path.exists(os.path.dirname(f)) for f in files)  # removed afterwards


def test_a_failed_round_names_the_rank_that_failed_first_and_its_error_line(monkeypatch):
    monkeypatch.setattr(rank_workers, "GRACE_S", 0.5)
    before = set(os.listdir(rank_workers.tempfile.gettempdir()))
    m = rank_workers.measure_ranks(WORKLOAD, "stand-in", lambda out: [sys.executable, "-c", FAIL, out], ENV, 120,
                                   describe_death)
    why = m.error.message
    assert why.startswith("2 of 2 tensor-parallel ranks failed: rank 1: "), why
    assert "RuntimeError: the store could not be reached; rank 0: stopped 0.5 s after rank 1 failed" in why, why
    assert not any(s in why for s in ("Traceback", "File ", "second line", "SIGKILL")), why
    assert m.error.kind == "crash"
    assert not {f for f in set(os.listdir(rank_workers.tempfile.gettempdir())) - before
                if f.startswith("memcheck-tp-")}  # the round's folder is gone


def test_init_rank_joins_through_the_rendezvous_file(tmp_path, monkeypatch):
    """One rank alone: init_rank meets through file://, with no MASTER_ADDR or MASTER_PORT to read."""
    import torch.distributed as dist

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    rank_workers.init_rank(0, 1, str(tmp_path / "rendezvous"), torch.device("cpu"))
    try:
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()


def test_a_ranks_heap_trace_runs_until_its_group_is_left(tmp_path):
    """The group's threads free collectives' tensors and take the GIL on their own; a tracemalloc.stop() racing them
    crashed ranks with SIGSEGV on Python 3.11 (CPython gh-128679). A rank's collectors read the heap's peak when the
    run returns and leave the trace running; finish_rank stops it after the group is left and its threads joined."""
    import tracemalloc

    import torch.distributed as dist

    from memcheck.measurement import Measurement
    from memcheck.metrics.collect import CollectorOptions, Collectors

    rank_workers.init_rank(0, 1, str(tmp_path / "rendezvous"), torch.device("cpu"))
    try:
        collectors = Collectors(torch.device("cpu"), CollectorOptions(cpu_tensors=False, in_rank=True))
        collectors.start()
        collectors.run_started()
        held = [bytearray(1 << 20) for _ in range(4)]
        t = torch.ones(8)
        dist.all_reduce(t)
        collectors.run_finished()
        del held
        assert tracemalloc.is_tracing(), "the trace stopped while the group's threads ran"
        metrics = collectors.stop()
        assert metrics["host.heap_alloc.peak"].value >= 4 << 20  # read when the run returned
        assert "pt_gloo_runloop" in _thread_names()
        rank_workers.finish_rank(Measurement("w", "stand-in"), 1)
        assert not dist.is_initialized() and not tracemalloc.is_tracing()
        assert "pt_gloo_runloop" not in _thread_names()  # the group's threads were joined before the trace stopped
    finally:  # a failed assertion leaves neither the group nor the trace to the tests after it
        if dist.is_initialized():
            dist.destroy_process_group()
        tracemalloc.stop()


def _thread_names() -> list[str]:
    tasks = "/proc/self/task"
    return [open(os.path.join(tasks, t, "comm")).read().strip() for t in os.listdir(tasks)]
