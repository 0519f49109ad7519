"""The engine's behaviour: chunked prefill under the token budget, arrivals, preemption by recompute
with a tiny pool (same tokens, every block back), the stall guard, the workspace, unsupported inputs."""
import types

import pytest
import torch

from memcheck.stacks.paged import PagedStack
from memcheck.stacks.paged.block_manager import BlockManager
from memcheck.stacks.paged.config import EngineConfig
from memcheck.stacks.paged.kv_pool import KVPool
from memcheck.stacks.paged.model_runner import ModelRunner
from memcheck.stacks.paged.request import Request
from memcheck.stacks.paged.scheduler import Scheduler
from paged_helpers import make_workload, run_stack

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="module")
def spied(tmp_path_factory):
    """The mixed batch through `paged`, recording every batch the runner gets (a generous pool)."""
    batches = []
    original = ModelRunner.step

    def step(self, batch, *args, **kwargs):
        batches.append([(s.index, s.num_computed, n, len(s)) for s, n in batch])
        return original(self, batch, *args, **kwargs)

    ModelRunner.step = step
    try:
        result, probe = run_stack(PagedStack, make_workload(tmp_path_factory.mktemp("wl")))
    finally:
        ModelRunner.step = original
    return result, probe, batches


def test_chunked_prefill_under_the_token_budget(spied):
    _, _, batches = spied
    assert all(sum(n for _, _, n, _ in b) <= 48 for b in batches)
    chunks = [(i, start, n) for b in batches for i, start, n, length in b if n > 1 and start + n < length]
    assert chunks, "a 70-token prompt under a 48-token budget must be prefilled in chunks"
    mixed = [b for b in batches if any(n == 1 for *_, n, _ in b) and any(n > 1 for *_, n, _ in b)]
    assert mixed, "decodes and prefill chunks share forward passes (continuous batching)"


def test_requests_wait_for_their_arrival_step(spied):
    _, _, batches = spied
    first_step = {}
    for step, b in enumerate(batches):
        for i, *_ in b:
            first_step.setdefault(i, step)
    assert first_step[0] == first_step[1] == 0
    assert first_step[2] >= 1 and first_step[3] >= 1
    assert first_step[4] >= 3


def test_preemption_by_recompute_with_a_tiny_pool(tmp_path, spied):
    reference, _, _ = spied
    # 11 blocks hold the longest request (70 + 16 - 1 tokens); two 37-token prompts admitted together
    # (5 blocks each) outgrow 12 blocks as they decode (7 each).
    wl = make_workload(tmp_path, engine={"block_size": 8, "max_num_batched_tokens": 48, "num_blocks": 12})
    result, probe = run_stack(PagedStack, wl)
    notes = " ".join(result.notes)
    preemptions = int(notes.split(" preemptions")[0].split()[-1])
    assert preemptions > 0, notes
    assert result.outputs == reference.outputs
    assert result.metrics["kv.blocks_unreclaimed"].value == 0
    assert max(p["kv.bytes"] for _, p in probe.points) <= result.metrics["kv.bytes.peak"].value


def test_decode_steps_launch_before_the_last_tokens_are_read(tmp_path, monkeypatch):
    """pending.py: a decode-only step is launched while the previous step's tokens are still unread (its input ids
    come from them on the device), and the tokens are those of an engine that reads every step's tokens first."""
    original, live = ModelRunner.step, []

    def deferring(self, batch, return_logits=False, after=None, defer=False):
        live.append(after is not None and not after.landed)
        return original(self, batch, return_logits, after, defer)

    def reading(self, batch, return_logits=False, after=None, defer=False):
        return original(self, batch, return_logits, after, False)

    wl = make_workload(tmp_path)
    monkeypatch.setattr(ModelRunner, "step", deferring)
    deferred, _ = run_stack(PagedStack, wl)
    monkeypatch.setattr(ModelRunner, "step", reading)
    read, _ = run_stack(PagedStack, wl)
    assert sum(live) >= 10, live
    assert deferred.outputs == read.outputs and all(len(o) >= 16 for o in deferred.outputs)
    assert deferred.metrics["tpot"].value > 0


def _requests(*specs, block_size=4):
    return [Request(i, list(range(1, p + 1)), n, 0, block_size) for i, (p, n) in enumerate(specs)]


def _serve(scheduler, seqs, max_steps=500):
    """Drive the scheduler with a fake model that samples token 7 for everyone."""
    for s in seqs:
        scheduler.add(s)
    log = []
    while scheduler.busy and len(log) < max_steps:
        batch = scheduler.schedule()
        assert batch, "stalled"
        log.append([(s.index, n) for s, n in batch])
        scheduler.finish_step(batch, {s.seq_id: 7 for s, _ in batch}, 0.0)
    return log


def test_scheduler_frees_blocks_the_step_a_sequence_finishes():
    blocks = BlockManager(num_blocks=8, block_size=4)
    sched = Scheduler(EngineConfig(4, 8, max_num_seqs=4, max_num_batched_tokens=16), blocks)
    seqs = _requests((6, 2), (5, 6))
    sched.add(seqs[0])
    sched.add(seqs[1])
    batch = sched.schedule()  # both prompts in one pass
    assert [(s.index, n) for s, n in batch] == [(0, 6), (1, 5)]
    sched.finish_step(batch, {s.seq_id: 7 for s, _ in batch}, 0.0)
    held = blocks.blocks_held
    batch = sched.schedule()
    done = sched.finish_step(batch, {s.seq_id: 7 for s, _ in batch}, 0.0)
    assert [s.index for s in done] == [0] and seqs[0].output == [7, 7]
    assert blocks.blocks_held < held and not seqs[0].block_table  # freed in that very step


def test_scheduler_preempts_youngest_and_recomputes():
    blocks = BlockManager(num_blocks=6, block_size=4)
    sched = Scheduler(EngineConfig(4, 6, max_num_seqs=4, max_num_batched_tokens=64), blocks)
    seqs = _requests((8, 9), (8, 9))  # each needs 4 blocks at its longest, the pool has 6
    log = _serve(sched, seqs)
    assert sched.preemptions >= 1 and seqs[1].preemptions >= 1
    assert all(s.output == [7] * 9 for s in seqs)
    assert blocks.blocks_held == 0
    recompute = [n for b in log for i, n in b if i == 1 and n > 8]
    assert recompute, "a preempted sequence is recomputed: prompt plus what it had generated"


def test_scheduler_respects_max_num_seqs_and_budget():
    blocks = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(EngineConfig(4, 64, max_num_seqs=2, max_num_batched_tokens=10), blocks)
    log = _serve(sched, _requests((12, 3), (3, 3), (3, 3)))
    assert all(len(b) <= 2 and sum(n for _, n in b) <= 10 for b in log)


def test_stall_is_an_error_not_a_hang(tmp_path):
    blocks = BlockManager(num_blocks=2, block_size=4)
    sched = Scheduler(EngineConfig(4, 2, max_num_seqs=4, max_num_batched_tokens=64), blocks)
    sched.add(_requests((12, 1))[0])  # 3 blocks: never fits
    assert sched.schedule() == []
    with pytest.raises(ValueError, match="needs 4 KV blocks; the pool has 2"):
        wl = make_workload(tmp_path, requests=[{"prompt_tokens": 12, "max_new_tokens": 4}],
                           engine={"block_size": 4, "num_blocks": 2})
        EngineConfig.from_workload(wl, wl.request_list())


def test_page_footprint_matches_brute_force():
    layers = [types.SimpleNamespace(self_attn=types.SimpleNamespace()) for _ in range(3)]
    model = types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))
    spec = types.SimpleNamespace(mla=False, layers=3, kv_heads=2, head_dim=64)
    cfg = EngineConfig(block_size=16, num_blocks=600, max_num_seqs=4, max_num_batched_tokens=64)
    pool = KVPool(model, spec, cfg, torch.float32, "cpu")
    reads = [([5, 400, 3], 40), ([599], 1), (list(range(100, 164)), 16 * 64)]
    pages = set()
    for cache in pool.caches:
        for table, length in reads:
            for pos in range(length):
                block, off = table[pos // 16], pos % 16
                addr = cache[block, off].data_ptr()
                pages.update({addr >> 21, (addr + 2 * 64 * 4 - 1) >> 21})
    assert pool.page_footprint(reads) == len(pages)
    assert pool.page_footprint([]) == 0


def test_workspace_is_declared_and_exposed(tmp_path):
    wl = make_workload(tmp_path, requests=[{"count": 2, "prompt_tokens": 8, "max_new_tokens": 2}])
    stack = PagedStack(wl, torch.device("cpu"))
    stack.prepare()
    try:
        ws = stack.workspace_bytes()
        # budget x (residual + widest layer phase) at least: 48 tokens x (2 x 64 + 2 x 128) float32 values
        assert ws >= 48 * (2 * 64 + 2 * 128) * 4
        assert stack.weights_bytes() == sum(p.numel() * 4 for p in stack.model.parameters())
    finally:
        stack.close()


def test_cuda_graphs_setting(tmp_path):
    """engine.cuda_graphs (default on) and vLLM's enforce_eager turn the decode graphs off; a non-boolean is
    refused naming the field."""
    from memcheck.errors import UsageError

    on = make_workload(tmp_path, name="graphs-on")
    assert EngineConfig.from_workload(on, on.request_list()).cuda_graphs
    for engine in ({"cuda_graphs": False}, {"enforce_eager": True}):
        wl = make_workload(tmp_path, name="graphs-off", engine={"block_size": 8, **engine})
        assert not EngineConfig.from_workload(wl, wl.request_list()).cuda_graphs
    with pytest.raises(UsageError, match="engine.cuda_graphs"):
        make_workload(tmp_path, name="graphs-bad", engine={"cuda_graphs": "yes"})
