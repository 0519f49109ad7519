"""The paged KV meter computes kv.page_footprint after the run, from the steps whose decode reads the next
step does not cover: it must equal the max over every decode step computed step by step, as it was."""
import random

import pytest
import torch
from paged_helpers import Probe, make_workload, run_stack

from memcheck.stacks.paged import PagedStack
from memcheck.stacks.paged import kv_meter as meter_module
from memcheck.stacks.paged.kv_pool import KVPool
from memcheck.stacks.paged.kv_meter import KVMeter

MiB = 2**20


class FakePool:
    """Two cache tensors 64 MiB apart with 1.5 MiB blocks: a block's rows straddle 2 MiB pages or not
    depending on its index and how many tokens are read, so the footprint moves from step to step."""

    block_size = 16
    block_bytes = 3 * MiB
    token_bytes = block_bytes // block_size
    _block_stride = 3 * MiB // 2
    _token_stride = _block_stride // block_size
    _bases = torch.tensor([0, 64 * MiB], dtype=torch.int64)
    page_footprint = KVPool.page_footprint


class FakeBlocks:
    blocks_held = 0


def simulate(seed: int, steps: int = 300, num_blocks: int = 40):
    """A random engine: arrivals, decode steps, prefill-only steps, finishes and preemptions whose blocks
    go back to the free list and are handed out again. Returns (meter, per-step footprints)."""
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    live: list[dict] = []
    meter, per_step = KVMeter(FakePool(), FakeBlocks(), Probe()), []
    for step in range(steps):
        if len(live) < 6 and rng.random() < 0.3:  # an arrival, prefilled this step
            length = rng.randint(1, 40)
            need = -(-(length + 1) // FakePool.block_size)
            if need <= len(free):
                live.append({"table": [free.pop() for _ in range(need)], "length": length})
        decoding = [s for s in live if rng.random() < 0.97]  # a few sit out (prefill-only steps too)
        decoded = [(list(s["table"]), s["length"] + 1) for s in decoding]
        for s in decoding:
            s["length"] += 1
            if -(-(s["length"] + 1) // FakePool.block_size) > len(s["table"]) and free:
                s["table"].append(free.pop())
        for s in list(live):
            if rng.random() < 0.03 or -(-(s["length"] + 1) // FakePool.block_size) > len(s["table"]):
                live.remove(s)  # finished or preempted: its blocks are reused, first freed first
                free.extend(reversed(s["table"]))
        if decoded:
            per_step.append(FakePool().page_footprint(decoded))
        meter.after_step(step, [], decoded)
    return meter, per_step


@pytest.mark.parametrize("seed", range(8))
def test_footprint_after_the_run_is_the_max_over_every_step(seed):
    meter, per_step = simulate(seed)
    assert len(set(per_step)) > 3, "the simulation must move the footprint"
    assert meter.page_footprint() == max(per_step)
    assert len(meter._kept) < len(per_step) / 2, "most steps are covered by the next one"


def test_a_step_whose_reads_the_next_step_drops_is_kept():
    meter = KVMeter(FakePool(), FakeBlocks(), Probe())
    meter.after_step(1, [], [([0, 1, 2], 40), ([5], 3)])  # the larger read
    meter.after_step(2, [], [([5], 4)])  # the first sequence finished
    assert meter.page_footprint() == FakePool().page_footprint([([0, 1, 2], 40), ([5], 3)])


def test_same_blocks_under_another_sequence_still_cover():
    meter = KVMeter(FakePool(), FakeBlocks(), Probe())
    meter.after_step(1, [], [([3, 4], 20)])
    meter.after_step(2, [], [([3, 4], 21)])  # a later read of the same rows, whoever owns them, covers
    meter.after_step(3, [], [([3, 7], 21)])  # a different second block: not covered
    assert len(meter._kept) == 1 and meter._kept[0] == [([3, 4], 21)]


@pytest.mark.parametrize("engine", [None, {"block_size": 8, "max_num_batched_tokens": 48, "num_blocks": 12}],
                         ids=["staggered-finish", "preempting"])
def test_the_engine_reports_the_max_over_every_step(tmp_path, monkeypatch, engine):
    per_step = []
    after_step = meter_module.KVMeter.after_step

    def step_by_step(self, step, running, decoded):
        if decoded:
            per_step.append(self.pool.page_footprint(decoded))
        after_step(self, step, running, decoded)

    monkeypatch.setattr(meter_module.KVMeter, "after_step", step_by_step)
    result, _ = run_stack(PagedStack, make_workload(tmp_path, engine=engine))
    assert len(per_step) > 10
    assert result.metrics["kv.page_footprint"].value == max(per_step)


def test_a_shorter_read_from_the_same_first_block_does_not_cover():
    meter = KVMeter(FakePool(), FakeBlocks(), Probe())
    meter.after_step(1, [], [([3, 4], 30)])  # finished; block 3 handed to a new, shorter sequence
    meter.after_step(2, [], [([3], 5)])
    assert meter.page_footprint() == FakePool().page_footprint([([3, 4], 30)])
