"""The engine loop: requests arrive at their arrival step (one step = one forward pass), the scheduler
packs decodes and prefill chunks under the token budget, the runner runs them, finished sequences
hand their blocks back in the same step. Greedy decoding, every request to its max_new_tokens."""
from __future__ import annotations

import time
from collections import deque

import torch

from .block_manager import BlockManager
from .config import EngineConfig, ModelSpec
from .graphs import DecodeGraphs
from .kv_pool import KVPool
from .kv_meter import KVMeter
from .model_runner import ModelRunner
from .request import Request
from .scheduler import Scheduler


class Engine:
    def __init__(self, model, spec: ModelSpec, cfg: EngineConfig, dtype, device, vision=None,
                 graph_sizes: tuple[int, int] | None = None):
        """graph_sizes (most sequences in a step, most blocks a sequence holds): capture CUDA graphs of
        decode steps up to those sizes (on CUDA, with engine.cuda_graphs on); None runs eagerly."""
        self.cfg, self.device = cfg, device
        # No prefix caching: the block manager seals a prompt's full blocks at allocation, before their
        # K/V exists, so a hit on a block still being prefilled (or preempted) would read garbage.
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size, prefix_caching=False)
        self.pool = KVPool(model, spec, cfg, dtype, device)
        graphs = None
        if graph_sizes and cfg.cuda_graphs and torch.device(device).type == "cuda":
            graphs = DecodeGraphs(model, device, *graph_sizes)
        self.runner = ModelRunner(model, device, vision, graphs)
        self.scheduler = Scheduler(cfg, self.blocks)
        self.steps = 0

    def warmup(self, prefill_tokens: int = 0) -> None:
        """Before the timed run, on CUDA: compile the prefill kernels with one pass of prefill_tokens that
        writes no cache slot, and capture the decode graphs (their kernels compiled on the way)."""
        if self.device.type != "cuda":
            return
        if prefill_tokens > 1:
            self.runner.warm_prefill(prefill_tokens, self.cfg.block_size)
        if self.runner.graphs is not None and not self.runner.graphs.captured:
            self.runner.graphs.capture()

    def generate(self, requests, prompts, collectors, image_tokens=None, image_sources=None):
        """Serve every request (prompts: full token ids, image placeholders first); returns them (in
        workload order), the KV meter and the wall time."""
        image_tokens = image_tokens or [0] * len(requests)
        image_sources = image_sources or [None] * len(requests)
        seqs = [Request(i, p, r.max_new_tokens, r.arrival_step, self.cfg.block_size, image_tokens[i], image_sources[i])
                for i, (r, p) in enumerate(zip(requests, prompts))]
        pending = deque(sorted(seqs, key=lambda s: s.arrival_step))
        meter = KVMeter(self.pool, self.blocks, collectors)
        start = time.perf_counter()
        step = 0
        while pending or self.scheduler.busy:
            if not self.scheduler.busy and pending[0].arrival_step > step:
                step = pending[0].arrival_step  # idle until the next arrival
            while pending and pending[0].arrival_step <= step:
                seq = pending.popleft()
                seq.t_arrived = time.perf_counter()
                self.scheduler.add(seq)
            batch = self.scheduler.schedule()
            if not batch:
                raise RuntimeError(f"the engine stalled: {len(self.scheduler.waiting)} waiting, "
                                   f"{self.blocks.num_free_blocks} of {self.cfg.num_blocks} blocks free")
            decoded = [(list(s.block_table), s.num_computed + 1) for s, n in batch if n == 1]
            sampled = self.runner.step(batch)
            self.scheduler.finish_step(batch, sampled, time.perf_counter())
            step += 1
            meter.after_step(step, self.scheduler.running, decoded)
        self.steps = step
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return seqs, meter, time.perf_counter() - start
