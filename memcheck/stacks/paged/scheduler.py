"""Which tokens the next forward pass carries, under a token budget (max_num_batched_tokens).

Running sequences go first, oldest first: a decoding sequence takes one token, a prefilling one the
next chunk of its prompt that fits. Arrived sequences are then admitted in order while blocks, the
budget and max_num_seqs allow. A decoding sequence that needs a new block when none is free preempts
the youngest running sequence (its blocks are freed; it goes back to the head of the queue and is
recomputed from its tokens later), never an out-of-memory error."""
from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .config import EngineConfig
from .request import Request


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager):
        self.cfg, self.blocks = cfg, blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    def add(self, seq: Request) -> None:
        self.waiting.append(seq)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Request, int]]:
        """[(sequence, tokens to feed)] for one forward pass; empty only if nothing can run."""
        budget = self.cfg.max_num_batched_tokens
        batch = []
        i = 0
        while i < len(self.running) and budget:
            seq = self.running[i]
            if seq.needs_slot and not self._reserve_slot(seq):
                break  # seq itself was preempted, and with it everyone younger
            n = min(seq.num_pending, budget)
            if n < seq.num_pending and not self.cfg.chunked_prefill:
                break
            batch.append((seq, n))
            budget -= n
            i += 1
        while self.waiting and budget and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq):
                break
            if seq.num_pending > budget and not self.cfg.chunked_prefill:
                break
            self.blocks.allocate(seq)
            seq.num_computed = 0
            self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.num_pending, budget)
            batch.append((seq, n))
            budget -= n
        return batch

    def _reserve_slot(self, seq: Request) -> bool:
        while not self.blocks.can_append(seq):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.blocks.append_slot(seq)
        seq.needs_slot = False
        return True

    def _preempt(self, seq: Request) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed, seq.needs_slot = 0, False
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def finish_step(self, batch: list[tuple[Request, int]], sampled: dict[int, int], now: float | None
                    ) -> list[Request]:
        """Account the fed tokens, append sampled ones, free the blocks of sequences that are done
        (in this very step). Returns the sequences that finished. now None: the tokens are placeholders
        (pending.py), timed when they land."""
        done = []
        for seq, n in batch:
            seq.num_computed += n
            if seq.num_computed < len(seq):
                continue  # a prefill chunk short of the end: nothing sampled
            seq.append_token(sampled[seq.seq_id])
            if now is not None:
                seq.t_first = seq.t_first or now
                seq.t_last = now
            if seq.finished:
                self.blocks.free(seq)
                self.running.remove(seq)
                done.append(seq)
            else:
                seq.needs_slot = True
        return done
