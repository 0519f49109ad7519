"""A decode step's greedy tokens while they are still on the device.

Every request here runs to its max_new_tokens, so what the engine schedules next never depends on a
sampled token's value, only on its count. The engine therefore launches step n+1 before it reads step
n's tokens: the host's scheduling, packing and launching of n+1 overlap the GPU's step n, instead of
the GPU idling through them (0.25-0.58 ms a step on the H200, 5-9% of a decode step). Step n's
sequences hold a placeholder token until then; step n+1 takes their input ids from step n's tokens on
the device (DecodeGraphs reads them inside the graph, an eager step gathers them), and any step that
needs the ids on the host (a prefill chunk, a recompute) lands the tokens first."""
from __future__ import annotations

import time

import torch

PLACEHOLDER = -1  # a sampled token not read yet: never fed to a model from the host


class PendingTokens:
    def __init__(self, seqs, tokens: torch.Tensor, host: torch.Tensor | None = None, ready=None):
        """tokens: [len(seqs)] on the device, row i sampled for seqs[i] (valid until the next step runs);
        host: a pinned copy being made of them, with `ready` the event that says it is done (CUDA); without
        them landing reads `tokens` directly."""
        self.slots = [(s, len(s)) for s in seqs]  # where each placeholder goes in its sequence
        self.rows = {s.seq_id: i for i, s in enumerate(seqs)}
        self.tokens, self.host, self.ready = tokens, host, ready
        self.landed = False

    def placeholders(self) -> dict[int, int]:
        """{seq_id: PLACEHOLDER}: what Scheduler.finish_step appends until the tokens land."""
        return {s.seq_id: PLACEHOLDER for s, _ in self.slots}

    def read(self) -> dict[int, int]:
        """{seq_id: token}, waiting for them; the placeholders stay (for a caller that appends the tokens itself)."""
        if self.ready is not None:
            self.ready.synchronize()
        values = (self.host if self.host is not None else self.tokens)[:len(self.slots)].tolist()
        return {s.seq_id: t for (s, _), t in zip(self.slots, values)}

    def land(self) -> None:
        """Wait for the tokens, write them over the placeholders, stamp the sequences' token times."""
        if self.landed:
            return
        values = self.read()
        now = time.perf_counter()
        for seq, index in self.slots:
            token = values[seq.seq_id]
            seq.token_ids[index] = token
            seq.t_first = seq.t_first or now
            seq.t_last = now
        self.landed = True
