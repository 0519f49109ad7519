"""The engine loop: requests arrive at their arrival step (one step = one forward pass), the scheduler
packs decodes and prefill chunks under the token budget, the runner runs them, finished sequences
hand their blocks back in the same step. Greedy decoding, every request to its max_new_tokens.

A decode-only step is launched before the previous one's tokens are read (pending.py): the host
schedules and launches step n+1 while the GPU runs step n, then reads step n's tokens."""
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
from .pending import PendingTokens
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
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size)
        self.pool = KVPool(model, spec, cfg, dtype, device)
        graphs = None
        if graph_sizes and cfg.cuda_graphs and torch.device(device).type == "cuda":
            graphs = DecodeGraphs(model, device, *graph_sizes)
        self.runner = ModelRunner(model, device, vision, graphs)
        self.scheduler = Scheduler(cfg, self.blocks)
        self.steps = 0
        self.in_flight: PendingTokens | None = None  # the last step's tokens, not read yet

    def advance(self, batch: list[tuple[Request, int]]) -> None:
        """Run one scheduled step: launch it, then read the previous step's tokens (which it no longer
        waits for), then account it (its own tokens as placeholders when it is a decode-only step)."""
        out = self.runner.step(batch, after=self.in_flight, defer=True)
        self.drain()
        if isinstance(out, PendingTokens):
            self.scheduler.finish_step(batch, out.placeholders(), None)
            self.in_flight = out
        else:
            self.scheduler.finish_step(batch, out, time.perf_counter())

    def drain(self) -> None:
        """Read the tokens of the step in flight, if any."""
        if self.in_flight is not None:
            self.in_flight.land()
            self.in_flight = None

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
            self.advance(batch)
            step += 1
            meter.after_step(step, self.scheduler.running, decoded)
        self.drain()
        self.steps = step
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return seqs, meter, time.perf_counter() - start
