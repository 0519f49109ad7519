"""CUDA graphs of the decode step: one per batch-size bucket, replayed instead of launching the
forward pass kernel by kernel from Python (a decode step at batch 32 is ~1,500 small launches).

A graph reads fixed device buffers, so a step's inputs (token ids, where each id comes from, positions,
cache slots, sequence lengths, block tables) are packed into one pinned host buffer and copied over in
one transfer; the graph embeds, runs every layer, takes the logits and the greedy tokens, and leaves the
tokens at the head of the device buffer, where the next step can take its input ids from them (a row's
source: the previous step's row j, or its own id from the host) without the host having read them
(pending.py). The tokens' copy to the host is the step's only transfer back. A batch of n sequences
replays the smallest bucket >= n; the padding rows write no cache slot (slot -1) and attend to one token
of block 0, and their tokens are dropped. Two pinned buffers each way alternate, so the host packs step
n+1 while step n's transfers may still be queued.

Every bucket is run once eagerly first (Triton compiles, cuBLAS handles, the decode kernels'
occupancy probes), then captured largest first into one shared memory pool, so the pool holds about
one largest-bucket step's activations. Its size (with the capture stream's cuBLAS workspace) is
measured at capture and declared with the workspace."""
from __future__ import annotations

import time

import numpy as np
import torch

from .context import StepContext

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # at most 1.5x padding past 8


class DecodeGraphs:
    def __init__(self, model, device, max_batch: int, max_blocks: int):
        self.model, self.device = model, device
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        self.max_batch, self.width = max_batch, max(1, max_blocks)
        # host: [ids | sources | positions | slots | seq_lens], a row of each, then the block tables [max_batch, width];
        # device: the last step's tokens (a row), then the host's layout. Rows are padded to 16 bytes: Triton
        # specializes a kernel on its pointers' 16-byte alignment, and an eager step's fresh tensors are aligned
        # (at max_batch 5 the graphs' seq_lens and tables were not: a second variant compiled inside the timed run)
        self.row = -(-max_batch // 4) * 4
        size = 5 * self.row + max_batch * self.width
        self.hosts = [torch.zeros(size, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.outs = [torch.zeros(max_batch, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.done = [torch.cuda.Event(), torch.cuda.Event()]  # recorded after the last step that used hosts[k], outs[k]
        self.turn = 0
        self.buffer = torch.zeros(self.row + size, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool_bytes = 0
        self.replay_called_at = self.replayed_at = 0.0

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def fits(self, num_seqs: int, blocks: int) -> bool:
        return num_seqs <= self.max_batch and blocks <= self.width

    @property
    def host(self) -> torch.Tensor:
        """The pinned buffer the next step packs."""
        return self.hosts[self.turn]

    def fields(self, b: int):
        """The device buffer's views a graph of b rows reads: sources, positions, slots, seq_lens, block tables."""
        r, buf = self.row, self.buffer
        sources, positions, slots, seq_lens = (buf[i * r:i * r + b] for i in range(2, 6))
        return sources, positions, slots, seq_lens, buf[6 * r:].view(self.max_batch, self.width)[:b]

    def _forward(self, b: int) -> None:
        buf = self.buffer
        sources, positions, slots, seq_lens, table = self.fields(b)
        ids = torch.index_select(buf[:2 * self.row], 0, sources)  # the last step's tokens, or the ids from the host
        ctx = StepContext(positions.long(), slots.long(), b, decode_block_table=table, decode_seq_lens=seq_lens)
        hidden = self.model(ids.long(), ctx)
        buf[:b].copy_(self.model.logits(hidden).argmax(-1))

    @torch.inference_mode()
    def capture(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)  # before the capture stream's cuBLAS workspace
        self.pack([], [], [], [])  # every row padding: token 0 at position 0, no slot, one cached token
        self.host[5 * self.row:] = 0  # block 0 in every table
        self.buffer[self.row:].copy_(self.host)
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
                self._forward(b)
            self.graphs[b] = graph
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - before

    def pack(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
             sources: list[int] | None = None) -> None:
        """A step's inputs into the pinned host buffer, with numpy on its memory (torch's slicing of a host
        tensor costs ~10 us a call: the padding writes were most of a step's ~90 us of packing).
        sources[i] >= 0: row i's id is the previous step's token of row sources[i], on the device."""
        n, r = len(ids), self.row
        host = self.host.numpy()
        host[:n], host[n:r] = ids, 0
        own = host[r:2 * r]  # index into the device's [last tokens | ids]: r + i is row i's own id
        own[:] = np.arange(r, 2 * r)
        if sources is not None:
            for i, j in enumerate(sources):
                if j >= 0:
                    own[i] = j
        host[2 * r:2 * r + n], host[2 * r + n:3 * r] = positions, 0
        host[3 * r:3 * r + n], host[3 * r + n:4 * r] = slots, -1
        seq_lens = host[4 * r:5 * r]
        seq_lens[:n] = host[2 * r:2 * r + n]
        seq_lens[:n] += 1
        seq_lens[n:] = 1
        table = host[5 * r:].reshape(self.max_batch, self.width)
        for i, blocks in enumerate(tables):
            table[i, :len(blocks)] = blocks

    def launch(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
               sources: list[int] | None = None):
        """Queue one decode step of len(ids) sequences without waiting for it: (its tokens on the device,
        valid until the next step; their pinned host copy; the event that says the copy is done)."""
        if not self.captured:
            self.capture()
        n, r, k = len(ids), self.row, self.turn
        b = next(b for b in self.buckets if b >= n)
        self.done[k].synchronize()  # the step that used these host buffers two steps ago (done by now)
        self.pack(ids, positions, slots, tables, sources)
        size = 5 * r + b * self.width
        self.buffer[r:r + size].copy_(self.hosts[k][:size], non_blocking=True)
        self.replay_called_at = time.perf_counter()  # (benchmarks/paged_h200.py: packing before, the launch call after)
        self.graphs[b].replay()
        self.replayed_at = time.perf_counter()  # the host's part of the step ends here
        out = self.outs[k][:n]
        out.copy_(self.buffer[:n], non_blocking=True)
        self.done[k].record()
        self.turn = 1 - k
        return self.buffer[:n], out, self.done[k]

    def describe(self) -> str:
        return (f"CUDA graphs for decode batches of {', '.join(map(str, self.buckets))} sequences "
                f"(pool {self.pool_bytes / 2**20:.1f} MiB)")
