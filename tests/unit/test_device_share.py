"""Items at once on one GPU (memcheck/device_share.py): which item may start beside which, what each costs in GPU
seconds, and the runner's use of it (a claim from the baseline, an item alone where its numbers need it, an item
that ran out of memory beside others measured again alone). No GPU: the ledger is a file, the workers fakes."""
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from memcheck import device_share, runner
from memcheck.measurement import Measurement
from memcheck.metrics.value import MetricValue
from memcheck.states import ErrorKind, ItemError

GiB = 1 << 30


START_UNCLAIMED = runner._start_fork_server_unclaimed


def ledger(tmp_path, capacity=100 * GiB):
    return device_share.Ledger(str(tmp_path / "gpu.json"), capacity, poll_s=0.01, device_class="nvidia-h200")


def test_a_moment_shared_by_k_items_counts_one_kth_for_each():
    assert device_share.share(0, 10, []) == (10, 1)
    seconds, most = device_share.share(0, 10, [[5, 20]])  # alone 5 s, then beside one other 5 s
    assert seconds == pytest.approx(7.5) and most == 2
    seconds, most = device_share.share(0, 10, [[0, 10], [2, 4], [20, 30]])  # the last never overlaps
    assert seconds == pytest.approx(8 / 2 + 2 / 3) and most == 3


def hold_in_thread(led, item, claim, seconds, events, held, length=0.0):
    def body():
        with led.hold(item, claim, length) as h:
            events.append(("start", item, time.monotonic()))
            time.sleep(seconds)
            events.append(("end", item, time.monotonic()))
        held[item] = h
    t = threading.Thread(target=body)
    t.start()
    return t


def test_claims_that_fit_run_together_and_the_whole_device_waits_for_them(tmp_path):
    led, events, held = ledger(tmp_path), [], {}
    threads = [hold_in_thread(led, "a", 40 * GiB, 0.4, events, held),
               hold_in_thread(led, "b", 40 * GiB, 0.4, events, held)]
    time.sleep(0.1)
    threads.append(hold_in_thread(led, "alone", None, 0.1, events, held))
    for t in threads:
        t.join()
    order = [(kind, item) for kind, item, _ in events]
    assert order.index(("start", "b")) < order.index(("end", "a"))  # a and b at once
    assert order.index(("start", "alone")) > max(order.index(("end", "a")), order.index(("end", "b")))
    assert held["alone"].most_at_once == 1 and held["alone"].gpu_seconds == pytest.approx(
        held["alone"].held_seconds)
    assert held["a"].most_at_once == 2 and held["a"].gpu_seconds < held["a"].held_seconds
    # Every moment the device was held is counted once over the items: their GPU seconds add up to it.
    starts = min(h.start for h in held.values())
    ends = max(h.end for h in held.values())
    busy = ends - starts - max(0.0, held["alone"].start - max(held["a"].end, held["b"].end))
    assert sum(h.gpu_seconds for h in held.values()) == pytest.approx(busy, abs=0.02)


def test_a_claim_that_does_not_fit_waits(tmp_path):
    led, events, held = ledger(tmp_path, capacity=70 * GiB), [], {}
    first = hold_in_thread(led, "a", 40 * GiB, 0.3, events, held)
    time.sleep(0.05)
    second = hold_in_thread(led, "b", 40 * GiB, 0.05, events, held)  # 80 GiB > 70 GiB less the reserve
    first.join(), second.join()
    order = [(kind, item) for kind, item, _ in events]
    assert order == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]
    assert held["a"].waited < 0.05 and held["b"].waited >= 0.2  # b waited out most of a's 0.3 s


def test_the_longest_waiting_item_starts_before_shorter_ones_that_would_fit_sooner(tmp_path):
    """A long item started last is what a job of items at once waits for: with 60 GiB held on a 100 GiB device, a
    long item (50 GiB) waits, and a shorter one (30 GiB) that would fit beside the holder waits behind it."""
    led, events, held = ledger(tmp_path), [], {}
    threads = [hold_in_thread(led, "holder", 60 * GiB, 0.3, events, held)]
    time.sleep(0.05)
    threads.append(hold_in_thread(led, "long", 50 * GiB, 0.2, events, held, length=80.0))
    time.sleep(0.05)
    threads.append(hold_in_thread(led, "short", 30 * GiB, 0.05, events, held, length=10.0))
    for t in threads:
        t.join()
    order = [(kind, item) for kind, item, _ in events]
    assert order.index(("start", "short")) > order.index(("end", "holder"))  # it fit at once (90 of 98 GiB)
    assert order.index(("start", "long")) > order.index(("end", "holder"))
    assert held["short"].start >= held["long"].start - 0.05  # admitted with the long one, not before it

    # Without the long one waiting, the same short item starts beside the holder at once.
    led, events, held = ledger(tmp_path / "again"), [], {}
    (tmp_path / "again").mkdir()
    threads = [hold_in_thread(led, "holder", 60 * GiB, 0.2, events, held)]
    time.sleep(0.05)
    threads.append(hold_in_thread(led, "short", 30 * GiB, 0.05, events, held, length=10.0))
    for t in threads:
        t.join()
    order = [(kind, item) for kind, item, _ in events]
    assert order.index(("start", "short")) < order.index(("end", "holder"))


def test_items_of_the_same_length_go_first_come(tmp_path):
    """Items of the same expected length (none known: 0) go in the order they asked."""
    led, events, held = ledger(tmp_path), [], {}
    threads = [hold_in_thread(led, "holder", 60 * GiB, 0.3, events, held)]
    time.sleep(0.05)
    threads.append(hold_in_thread(led, "big", 50 * GiB, 0.05, events, held))
    time.sleep(0.05)
    threads.append(hold_in_thread(led, "small", 10 * GiB, 0.05, events, held))
    for t in threads:
        t.join()
    order = [(kind, item) for kind, item, _ in events]
    assert order.index(("start", "big")) > order.index(("end", "holder"))
    # small asked after big, at the same length: big is ahead, first come
    assert order.index(("start", "small")) > order.index(("end", "holder"))


def test_a_waiter_whose_process_died_keeps_no_room(tmp_path):
    led = ledger(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with led._locked() as state:
        state["waiting"]["gone"] = {"pid": dead.pid, "item": "x[hf]", "bytes": None, "length": 1e9,
                                    "since": time.time()}
    with led.hold("y[hf]", GiB, 1.0) as held:  # a dead whole-device waiter ahead would keep it out forever
        pass
    assert held.waited < 1.0


def test_an_item_interrupted_while_waiting_leaves_the_queue(tmp_path, monkeypatch):
    led = ledger(tmp_path)
    with led._locked() as state:
        state["holders"]["other"] = {"pid": os.getpid(), "item": "o[hf]", "bytes": None, "start": time.time()}

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(device_share.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with led.hold("w[hf]", GiB, 5.0):
            pass
    with led._locked() as state:
        assert state["waiting"] == {}


def test_an_item_says_how_long_it_waited_for_the_gpu(fake_gpu, monkeypatch):
    """The wait is a phase of its own (--memcheck-durations): a job bound by the GPU's memory shows it there."""
    monkeypatch.setattr(runner, "_measure_rounds", lambda *a, **k: measured())
    done = []
    item = threading.Thread(target=lambda: done.append(
        runner.measure_item(SimpleNamespace(name="w"), "hf", runner.Settings(parallel_items=2))))
    with fake_gpu.hold("big[hf]", None):  # the whole GPU, for 0.2 s after the item asks
        item.start()
        time.sleep(0.2)
    item.join()
    m = done[0]
    assert m.phases["gpu_wait"] >= 0.15 and m.gpu_held_seconds < m.phases["gpu_wait"]  # waiting holds no GPU


def test_a_holder_whose_process_died_holds_nothing(tmp_path):
    led = ledger(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with led._locked() as state:
        state["holders"]["gone"] = {"pid": dead.pid, "item": "x[hf]", "bytes": None, "start": time.time()}
    with led.hold("y[hf]", None) as held:  # would wait forever behind a whole-device claim of a live holder
        pass
    assert held.most_at_once == 1


def test_an_unreadable_ledger_starts_afresh(tmp_path):
    led = ledger(tmp_path)
    (tmp_path / "gpu.json").write_text("{not json")
    with led.hold("x[paged]", GiB) as held:
        pass
    assert held.gpu_seconds is not None


class Stack:
    @classmethod
    def needs_device_alone(cls, rootdir):
        return None


class AloneStack(Stack):
    @classmethod
    def needs_device_alone(cls, rootdir):
        return "reads the device's free memory"


def workload(rounds=1, tp=1):
    return SimpleNamespace(rounds=rounds, time_gated=rounds >= 3, tensor_parallel=tp)


@pytest.mark.parametrize("wl,stack,peak,at_once,says", [
    (workload(), Stack, 10 * GiB, 1, "items run one at a time"),
    (workload(rounds=3), Stack, 10 * GiB, 4, "its time metrics are judged in this profile (3 rounds)"),
    (workload(), AloneStack, 10 * GiB, 4, "reads the device's free memory"),
    (workload(tp=2), Stack, 10 * GiB, 4, "a tensor-parallel item holds its GPUs alone"),
    (workload(), Stack, None, 4, "no baseline gpu.device_used.peak"),
])
def test_an_item_claims_the_whole_device_where_its_numbers_need_it(wl, stack, peak, at_once, says):
    claim, why = device_share.claim(wl, stack, peak, ".", at_once)
    assert claim is None and says in why


def test_an_item_with_a_baseline_claims_its_peak_with_room_to_regress():
    assert device_share.claim(workload(), Stack, 20 * GiB, ".", 4) == (int(20 * GiB * device_share.CLAIM_MARGIN), "")


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """The runner on a 'GPU' whose ledger is a file and whose rounds are scripted."""
    led = ledger(tmp_path)
    monkeypatch.setattr(runner, "_device_ledger", lambda device: led)
    monkeypatch.setattr(runner, "_attention_missing", lambda *a: None)
    monkeypatch.setattr(runner, "_claim", lambda *a: (10 * GiB, "", 0.0))
    monkeypatch.setattr(runner, "_runs_on_gpu", lambda *a: True)
    monkeypatch.setattr(runner, "_start_fork_server_unclaimed", lambda *a: 0.0)
    return led


def measured(error=None):
    m = Measurement("w", "hf", metrics={"time.wall": MetricValue(1.0), "gpu.heap_alloc.peak": MetricValue(5)})
    m.error = error
    return m


def test_an_item_out_of_memory_beside_others_is_measured_again_alone(fake_gpu, monkeypatch):
    calls = []

    def rounds(wl, stack, settings, shared=False):
        calls.append(shared)
        if len(calls) == 1:
            with fake_gpu.hold("other[paged]", GiB):  # another item holds the GPU while this one runs
                time.sleep(0.05)
            return measured(ItemError(ErrorKind.OOM, "CUDA out of memory"))
        return measured()

    monkeypatch.setattr(runner, "_measure_rounds", rounds)
    m = runner.measure_item(SimpleNamespace(name="w"), "hf", runner.Settings(parallel_items=2))
    assert calls == [True, False]  # shared (NVML per process), then alone
    assert m.error is None and any("measured again alone" in n for n in m.notes)
    assert m.gpu_seconds > 0 and m.gpu_held_seconds >= m.gpu_seconds


@pytest.mark.parametrize("first_retries,again", [(2, True), (0, False)])
def test_an_item_whose_allocator_retried_beside_others_is_measured_again_alone(fake_gpu, monkeypatch,
                                                                               first_retries, again):
    """A cudaMalloc that failed and was retried after the cache was emptied moves the item's reserved and
    fragmentation numbers with what the others held: beside others it is measured again, alone."""
    calls = []

    def rounds(wl, stack, settings, shared=False):
        calls.append(shared)
        m = measured()
        if len(calls) == 1:
            with fake_gpu.hold("other[paged]", GiB):
                time.sleep(0.05)
            m.metrics["gpu.alloc_retries"] = MetricValue(first_retries)
        else:
            m.metrics["gpu.alloc_retries"] = MetricValue(0)
        return m

    monkeypatch.setattr(runner, "_measure_rounds", rounds)
    m = runner.measure_item(SimpleNamespace(name="w"), "hf", runner.Settings(parallel_items=2))
    assert calls == ([True, False] if again else [True])
    assert m.metrics["gpu.alloc_retries"].value == 0
    assert any("retried 2 times" in n and "measured again alone" in n for n in m.notes) == again


def test_time_metrics_are_marked_contended_only_when_another_item_shared_the_gpu(fake_gpu, monkeypatch):
    monkeypatch.setattr(runner, "_measure_rounds", lambda *a, **k: measured())
    alone = runner.measure_item(SimpleNamespace(name="w"), "hf", runner.Settings(parallel_items=2))
    assert alone.metrics["time.wall"].detail is None
    assert alone.gpu_seconds == pytest.approx(alone.gpu_held_seconds)

    def beside(*a, **k):
        with fake_gpu.hold("other[paged]", GiB):
            time.sleep(0.05)
        return measured()

    monkeypatch.setattr(runner, "_measure_rounds", beside)
    shared = runner.measure_item(SimpleNamespace(name="w"), "hf", runner.Settings(parallel_items=2))
    assert "2 items on the GPU at once" in shared.metrics["time.wall"].detail
    assert shared.gpu_seconds < shared.gpu_held_seconds
    assert any("beside up to 1 other items" in n for n in shared.notes)


def test_the_ledger_file_is_one_per_gpu_in_the_folder_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHECK_DEVICE_LEDGER_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: no capacity, whole-device claims only
    led = device_share.ledger("0", 0)
    assert os.path.dirname(led.path) == str(tmp_path) and led.capacity is None and led.device_class is None


def test_an_item_its_worker_will_skip_holds_no_gpu(fake_gpu, monkeypatch):
    monkeypatch.setattr(runner, "_runs_on_gpu", lambda *a: False)
    monkeypatch.setattr(runner, "_measure_rounds", lambda *a, **k: measured())
    with fake_gpu.hold("big[hf]", None):  # the whole GPU is held: a held item would wait here forever
        m = runner.measure_item(SimpleNamespace(name="w"), "vllm", runner.Settings(parallel_items=2))
    assert m.gpu_seconds is None


def test_a_stack_that_is_not_installed_or_too_few_gpus_means_the_item_skips(monkeypatch):
    from memcheck.stacks import vllm

    monkeypatch.setattr(vllm, "vllm_python", lambda rootdir=None: None)
    assert runner._runs_on_gpu(SimpleNamespace(tensor_parallel=1), "vllm", ".") is False
    assert runner._runs_on_gpu(SimpleNamespace(tensor_parallel=1), "hf", ".") is True
    assert runner._runs_on_gpu(SimpleNamespace(tensor_parallel=64), "paged", ".") is False


def test_memcheck_run_n_measures_items_at_once_with_work_stealing(monkeypatch):
    from memcheck import cli

    seen = []
    monkeypatch.setattr(cli, "_pytest", lambda args: seen.append(args) or 0)
    assert cli.main(["run", "-n", "3", "suites/example.yaml"]) == 0
    args = seen[0]
    assert args[args.index("-n") + 1] == "3" and args[args.index("--dist") + 1] == "worksteal"


def test_the_fork_server_starts_before_the_item_claims_the_gpu(fake_gpu, monkeypatch):
    """Its imports take no device memory: a claim held meanwhile would keep other items off the GPU for nothing."""
    events, servers = [], {}
    monkeypatch.setattr(runner, "_start_fork_server_unclaimed", START_UNCLAIMED)  # the fixture's stand-in undone
    monkeypatch.setattr(runner, "_SERVERS", servers)
    monkeypatch.setattr(runner, "_FORK_REFUSED", {})

    def start(python, env, rootdir):
        events.append(f"server, {len(fake_gpu._read()['holders'])} holding")
        time.sleep(0.05)
        servers[python] = object()

    def rounds(*a, **k):
        events.append(f"rounds, {len(fake_gpu._read()['holders'])} holding")
        return measured()

    monkeypatch.setattr(runner, "_fork_server", start)
    monkeypatch.setattr(runner, "_measure_rounds", rounds)
    wl = SimpleNamespace(name="w", tensor_parallel=1)
    first = runner.measure_item(wl, "hf", runner.Settings(parallel_items=2))
    second = runner.measure_item(wl, "hf", runner.Settings(parallel_items=2))
    assert events == ["server, 0 holding", "rounds, 1 holding", "rounds, 1 holding"]  # started once, before the first claim
    assert first.phases["startup"] >= 0.05 and any("before the item claimed the GPU" in n for n in first.notes)
    assert "startup" not in second.phases and not any("fork server started" in n for n in second.notes)
    assert first.gpu_seconds < first.phases["startup"]  # the server's imports are not GPU seconds


def test_no_server_is_started_ahead_where_rounds_would_not_fork_from_it(monkeypatch):
    monkeypatch.setattr(runner, "_python", lambda stack, rootdir: "python")
    monkeypatch.setattr(runner, "_FORK_REFUSED", {"python": "the server cannot fork here"})
    monkeypatch.setattr(runner, "_SERVERS", {})
    monkeypatch.setattr(runner, "_fork_server", lambda *a: pytest.fail("a server started where it was refused"))
    assert runner._start_fork_server_unclaimed(SimpleNamespace(tensor_parallel=1), "paged", runner.Settings()) == 0.0


def test_a_tensor_parallel_items_server_is_started_ahead_too(monkeypatch):
    """Its ranks fork from the server together (rank_workers.measure_ranks), so its imports come before the claim."""
    started = []
    monkeypatch.setattr(runner, "_python", lambda stack, rootdir: "python")
    monkeypatch.setattr(runner, "_FORK_REFUSED", {})
    monkeypatch.setattr(runner, "_SERVERS", {})
    monkeypatch.setattr(runner.rank_workers, "runs_ranks", lambda stack: True)
    monkeypatch.setattr(runner, "_fork_server", lambda python, env, rootdir: started.append(python))
    runner._start_fork_server_unclaimed(SimpleNamespace(tensor_parallel=2), "paged", runner.Settings())
    assert started == ["python"]


def test_an_items_claim_and_expected_length_come_from_its_baseline():
    """The committed H200 baseline of R1's staggered-finish item on stock transformers: its claim (device peak with
    room to regress) and the length the ledger orders waiting items by (its time.wall)."""
    from pathlib import Path

    from memcheck.baselines import BaselineStore

    folder = str(Path(__file__).resolve().parents[2] / "baselines")
    base = BaselineStore(folder).load("nvidia-h200", "r1-staggered-finish", "hf")
    led, wl = SimpleNamespace(device_class="nvidia-h200"), workload()
    wl.name = "r1-staggered-finish"
    claim, why, length = runner._claim(led, wl, "hf", runner.Settings(baselines=folder, parallel_items=6))
    assert why == "" and claim == int(base.metrics["gpu.device_used.peak"].value * device_share.CLAIM_MARGIN)
    assert length == base.metrics["time.wall"].value > 0
    claim, why, length = runner._claim(led, wl, "hf", runner.Settings(baselines=folder, parallel_items=1))
    assert (claim, length) == (None, 0.0) and why == "items run one at a time"
