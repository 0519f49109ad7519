"""The cheaper collectors measure what the old ones measured: cpu.heap_alloc.peak from the CPU allocator's
memory events alone equals the full profiler's to the byte, and kv.* are unchanged, on tiny workloads of
both stacks; the Python heap's peak is read when the run returns; the warm-up lands in time.warmup, before
the timed run and inside the collectors. No timing ratio is asserted here (benchmarks/collector_overhead.py
measures the cost)."""
import os
import sys
import time

import pytest
import torch

from memcheck import stacks
from memcheck.measure_round import measure
from memcheck.metrics import torch_cpu
from memcheck.metrics.collect import CollectorOptions, Collectors
from memcheck.metrics.host import HEAP_OFF
from memcheck.metrics.value import MetricValue

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "paged"))
from paged_helpers import make_workload  # noqa: E402

# kv.page_footprint depends on where malloc put the cache in each run (a page either way): its exactness is
# tested on the same addresses in tests/paged/test_paged_kv_meter.py.
KV = ("kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak", "kv.blocks_unreclaimed")


class FullProfiler:
    """cpu.heap_alloc.peak as it was measured before: torch.profiler.profile, every operator recorded too."""

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        self._prof.__enter__()

    def stop(self) -> dict:
        self._prof.__exit__(None, None, None)
        events = self._prof.profiler.kineto_results.experimental_event_tree()
        return {"cpu.heap_alloc.peak": MetricValue(torch_cpu.peak_of(events))}


def _work():
    x = torch.ones(256, 1024)  # 1 MiB
    y = torch.cat([x, x, x])  # 3 MiB more: peak 4 MiB
    del x
    return y.sum()


def test_memory_events_alone_give_the_full_profilers_peak():
    _work()  # one-time allocations out of the way
    full = FullProfiler()
    full.start()
    _work()
    old = full.stop()["cpu.heap_alloc.peak"].value
    new = torch_cpu.CpuTensorCollector()
    new.start()
    _work()
    assert new.stop()["cpu.heap_alloc.peak"].value == old == 4 * 2**20


@pytest.mark.parametrize("stack", ["hf", "paged"])
def test_memory_metrics_equal_the_old_collectors_on_a_tiny_workload(tmp_path, monkeypatch, stack):
    wl = make_workload(tmp_path, requests=[{"count": 2, "prompt_tokens": 12, "max_new_tokens": 6},
                                           {"count": 1, "prompt_tokens": 20, "max_new_tokens": 3, "arrival_step": 2}])
    options = CollectorOptions(python_heap=False)
    measure(wl, stack, torch.device("cpu"), options)  # warm: lazy one-time allocations happen here
    with monkeypatch.context() as patch:
        patch.setattr(torch_cpu, "CpuTensorCollector", FullProfiler)
        old = measure(wl, stack, torch.device("cpu"), options)
    new = measure(wl, stack, torch.device("cpu"), options)
    assert not (old.error or new.error), old.error or new.error
    assert new.metrics["cpu.heap_alloc.peak"].value == old.metrics["cpu.heap_alloc.peak"].value > 0
    for name in KV:
        assert new.metrics[name].value == old.metrics[name].value, name


def test_the_python_heap_peak_is_read_when_the_run_returns():
    c = Collectors("cpu", CollectorOptions(cpu_tensors=False, in_process=True))
    c.start()
    c.run_started()
    during = bytearray(2 * 2**20)
    del during
    c.run_finished()
    after = bytearray(16 * 2**20)  # the harness's own work after the run: not the workload's
    heap = c.stop()["host.heap_alloc.peak"]
    del after
    assert 2 * 2**20 <= heap.value < 16 * 2**20


class Clock:
    """perf_counter that moves only when told: time.wall and time.warmup become exact."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fake_stack(calls: list, clock: Clock, with_warmup: bool):
    class FakeStack(stacks.Stack):
        name = "fake"

        def prepare(self):
            calls.append("prepare")

        def run(self, probe):
            calls.append("run")
            clock.now += 2.0  # the timed run takes 2 s
            return stacks.RunResult([[1, 2]])

    if with_warmup:
        def warmup(self):
            calls.append("warmup")
            self.scratch = torch.ones(16 * 2**18)  # 16 MiB while warming up: counts in the peak
            del self.scratch
            clock.now += 5.0  # compiling takes 5 s

        FakeStack.warmup = warmup
    return FakeStack


def _measure_fake(tmp_path, monkeypatch, with_warmup: bool):
    calls, clock = [], Clock()
    monkeypatch.setattr(stacks, "load", lambda name: _fake_stack(calls, clock, with_warmup))
    monkeypatch.setattr(time, "perf_counter", clock)
    run_started = Collectors.run_started
    monkeypatch.setattr(Collectors, "run_started", lambda self: (calls.append("run_started"), run_started(self)))
    m = measure(make_workload(tmp_path), "fake", torch.device("cpu"), CollectorOptions(python_heap=False))
    return m, calls


def test_the_warmup_runs_before_the_timed_run_and_lands_in_time_warmup(tmp_path, monkeypatch):
    m, calls = _measure_fake(tmp_path, monkeypatch, with_warmup=True)
    assert m.error is None, m.error
    assert calls == ["prepare", "warmup", "run_started", "run"]
    assert m.metrics["time.warmup"].value == 5.0
    assert m.metrics["time.wall"].value == 2.0
    assert m.metrics["cpu.heap_alloc.peak"].value >= 16 * 2**20  # the collectors were on


def test_a_stack_without_warmup_reports_time_warmup_null(tmp_path, monkeypatch):
    m, calls = _measure_fake(tmp_path, monkeypatch, with_warmup=False)
    assert calls == ["prepare", "run_started", "run"]
    assert m.metrics["time.warmup"].value is None and "fake stack has no warm-up" in m.metrics["time.warmup"].reason
    assert m.metrics["time.wall"].value == 2.0


def _heap_stack(calls, clock, warmup_moves_memory):
    stack = _fake_stack(calls, clock, with_warmup=True)
    stack.warmup_moves_memory = warmup_moves_memory
    run = stack.run

    def heavy_run(self, probe):
        self.kept = bytearray(8 * 2**20)  # 8 MiB of Python heap in the run: more than the warm-up's
        return run(self, probe)

    def light_warmup(self):
        calls.append("warmup")
        self.scratch = bytearray(2 * 2**20)
        clock.now += 5.0

    stack.run, stack.warmup = heavy_run, light_warmup
    return stack


@pytest.mark.parametrize("moves_memory", [False, True])
def test_a_warmup_that_is_the_workload_once_measures_the_host_heap_and_the_run_stays_untraced(
        tmp_path, monkeypatch, moves_memory):
    calls, clock = [], Clock()
    monkeypatch.setattr(stacks, "load", lambda name: _heap_stack(calls, clock, moves_memory))
    monkeypatch.setattr(time, "perf_counter", clock)
    timed = CollectorOptions(python_heap=False, cpu_tensors=False, heap_in_warmup=True)
    m = measure(make_workload(tmp_path), "fake", torch.device("cpu"), timed)
    assert m.error is None, m.error
    assert calls == ["prepare", "warmup", "run"] and m.metrics["time.wall"].value == 2.0
    heap = m.metrics["host.heap_alloc.peak"]
    if moves_memory:  # a warm-up that moves memory is not the workload: the memory round measures the heap
        assert heap.value is None and heap.reason == HEAP_OFF
        assert m.metrics["time.warmup"].value == 5.0
    else:
        assert 2 * 2**20 <= heap.value < 8 * 2**20, "the host heap is the warm-up's, and the timed run is untraced"
        assert "during the warm-up" in heap.detail
        assert m.metrics["time.warmup"].value is None and "tracemalloc" in m.metrics["time.warmup"].reason


def test_the_memory_round_runs_only_for_what_the_timed_round_switched_off(tmp_path):
    from memcheck.measurement import Measurement
    from memcheck.metrics.collect import CPU_TENSORS_OFF
    from memcheck.metrics.value import MetricValue
    from memcheck.runner import Settings, _left_to_memory_round

    def timed(heap: MetricValue, cpu: MetricValue) -> Measurement:
        m = Measurement("w", "hf", "f.yaml", None)
        m.metrics = {"host.heap_alloc.peak": heap, "cpu.heap_alloc.peak": cpu}
        return m

    off = timed(MetricValue.null(HEAP_OFF), MetricValue.null(CPU_TENSORS_OFF))
    assert _left_to_memory_round(off, Settings()) == ["host.heap_alloc.peak", "cpu.heap_alloc.peak"]
    assert _left_to_memory_round(off, Settings(python_heap=False)) == ["cpu.heap_alloc.peak"]
    gpu_hf = timed(MetricValue(1000), MetricValue.null("measured on CPU runners only (the profiler would slow GPU runs)"))
    assert _left_to_memory_round(gpu_hf, Settings()) == []  # no memory round at all
    gpu_paged = timed(MetricValue.null(HEAP_OFF), gpu_hf.metrics["cpu.heap_alloc.peak"])
    assert _left_to_memory_round(gpu_paged, Settings()) == ["host.heap_alloc.peak"]


def test_the_timed_rounds_run_without_the_memory_rounds_collectors(tmp_path):
    from memcheck.runner import Settings, _worker_command

    wl = make_workload(tmp_path)
    timed = _worker_command(wl, "hf", Settings(), "out.json")
    memory = _worker_command(wl, "hf", Settings(), "out.json", memory_round=True)
    assert "--python-heap" not in timed and "--cpu-tensors" not in timed and "--heap-in-warmup" in timed
    assert "--python-heap" in memory and "--cpu-tensors" in memory and "--heap-in-warmup" not in memory
    assert "--heap-in-warmup" not in _worker_command(wl, "hf", Settings(python_heap=False), "out.json")
    no_heap = _worker_command(wl, "hf", Settings(python_heap=False), "out.json", memory_round=True)
    assert "--python-heap" not in no_heap and "--cpu-tensors" in no_heap


def test_an_items_rounds_read_the_workload_the_runner_parsed_once(tmp_path):
    import pickle

    from memcheck.runner import Settings, _worker_command

    wl = make_workload(tmp_path)
    timed = _worker_command(wl, "hf", Settings(), "out.json")
    memory = _worker_command(wl, "hf", Settings(), "out.json", memory_round=True)
    resolved = timed[timed.index("--resolved") + 1]
    assert memory[memory.index("--resolved") + 1] == resolved  # one file for every round of the item
    with open(resolved, "rb") as f:
        assert pickle.load(f) == wl
