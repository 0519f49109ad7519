"""CUDA graphs of the decode step: one per batch-size bucket, replayed instead of launching the
forward pass kernel by kernel from Python (a decode step at batch 32 is ~1,500 small launches).

A graph reads fixed device buffers, so a step's inputs (token ids, positions, cache slots, sequence
lengths, block tables) are packed into one pinned host buffer and copied over in one transfer; the
graph embeds, runs every layer, takes the logits and the greedy tokens, and one read of the tokens is
the step's only host sync. A batch of n sequences replays the smallest bucket >= n; the padding rows
write no cache slot (slot -1) and attend to one token of block 0, and their tokens are dropped.

Every bucket is run once eagerly first (Triton compiles, cuBLAS handles, the decode kernels'
occupancy probes), then captured largest first into one shared memory pool, so the pool holds about
one largest-bucket step's activations. Its size (with the capture stream's cuBLAS workspace) is
measured at capture and declared with the workspace."""
from __future__ import annotations

import time

import torch

from .context import StepContext

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # at most 1.5x padding past 8


class DecodeGraphs:
    def __init__(self, model, device, max_batch: int, max_blocks: int):
        self.model, self.device = model, device
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        self.max_batch, self.width = max_batch, max(1, max_blocks)
        # [ids | positions | slots | seq_lens] x max_batch, then the block tables [max_batch, width]
        size = max_batch * (4 + self.width)
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=True)
        self.buffer = torch.zeros(size, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.tokens: dict[int, torch.Tensor] = {}
        self.pool_bytes = 0
        self.replay_called_at = self.replayed_at = 0.0

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def fits(self, num_seqs: int, blocks: int) -> bool:
        return num_seqs <= self.max_batch and blocks <= self.width

    def _views(self, buf: torch.Tensor, b: int):
        m = self.max_batch
        ids, positions, slots, seq_lens = (buf[i * m:i * m + b] for i in range(4))
        return ids, positions, slots, seq_lens, buf[4 * m:].view(m, self.width)[:b]

    def _forward(self, b: int) -> torch.Tensor:
        ids, positions, slots, seq_lens, table = self._views(self.buffer, b)
        ctx = StepContext(positions.long(), slots.long(), b, decode_block_table=table, decode_seq_lens=seq_lens)
        hidden = self.model(ids.long(), ctx)
        return self.model.logits(hidden).argmax(-1)

    @torch.inference_mode()
    def capture(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)  # before the capture stream's cuBLAS workspace
        self.pack([], [], [], [])  # every row padding: token 0 at position 0, no slot, one cached token
        self.host[4 * self.max_batch:] = 0  # block 0 in every table
        self.buffer.copy_(self.host)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for b in self.buckets:  # compile and probe outside the capture
                self._forward(b)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):  # largest first: the smaller ones reuse its pool
            graph = torch.cuda.CUDAGraph()
            # thread_local: other threads (NCCL's watchdog at tensor_parallel > 1) may query their events meanwhile
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                self.tokens[b] = self._forward(b)
            self.graphs[b] = graph
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - before

    def pack(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]]) -> None:
        """A step's inputs into the pinned host buffer, with numpy on its memory (torch's slicing of a host
        tensor costs ~10 us a call: the four padding writes were most of a step's ~90 us of packing)."""
        n, m = len(ids), self.max_batch
        host = self.host.numpy()
        host[:n], host[n:m] = ids, 0
        host[m:m + n], host[m + n:2 * m] = positions, 0
        host[2 * m:2 * m + n], host[2 * m + n:3 * m] = slots, -1
        seq_lens = host[3 * m:4 * m]
        seq_lens[:n] = host[m:m + n]
        seq_lens[:n] += 1
        seq_lens[n:] = 1
        table = host[4 * m:].reshape(m, self.width)
        for i, blocks in enumerate(tables):
            table[i, :len(blocks)] = blocks

    def run(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]]) -> list[int]:
        """One decode step of len(ids) sequences; returns their greedy tokens."""
        if not self.captured:
            self.capture()
        n = len(ids)
        b = next(b for b in self.buckets if b >= n)
        self.pack(ids, positions, slots, tables)
        m = self.max_batch
        self.buffer[:4 * m + b * self.width].copy_(self.host[:4 * m + b * self.width], non_blocking=True)
        self.replay_called_at = time.perf_counter()  # (benchmarks/paged_h200.py: packing before, the launch call after)
        self.graphs[b].replay()
        self.replayed_at = time.perf_counter()  # the host's part of the step ends here
        return self.tokens[b][:n].tolist()

    def describe(self) -> str:
        return (f"CUDA graphs for decode batches of {', '.join(map(str, self.buckets))} sequences "
                f"(pool {self.pool_bytes / 2**20:.1f} MiB)")
