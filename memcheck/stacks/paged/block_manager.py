"""Fixed-size KV-cache blocks: a free list, one holder per block, reclaim on free, and the accounting the memory
metrics read.

The manager never touches tensors. It hands out block ids and cache slots; the caller writes K/V at those slots
(kernels.write_kv). No block is shared: the engine serves each request from its own prompt (vLLM's prefix caching
and beam-search forks are not modelled).
"""
from collections import deque

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.filled = [0] * num_blocks  # filled slots of each block
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # oldest freed first
        self.used_block_ids: set[int] = set()
        self._live_tokens = 0

    # -- accounting ------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.filled)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def blocks_held(self) -> int:
        return len(self.used_block_ids)

    @property
    def live_tokens(self) -> int:
        """Filled slots in held blocks."""
        return self._live_tokens

    @property
    def reserved_tokens(self) -> int:
        return self.blocks_held * self.block_size

    @property
    def waste(self) -> float:
        """1 - live/reserved: the share of held slots that hold no token."""
        return 1.0 - self._live_tokens / self.reserved_tokens if self.used_block_ids else 0.0

    # -- sequences ---------------------------------------------------------------------------
    def _take(self, tokens: int) -> int:
        """Hold the oldest freed block for `tokens` filled slots."""
        if not self.free_block_ids:
            raise RuntimeError("out of KV-cache blocks: call can_allocate/can_append first")
        block_id = self.free_block_ids.popleft()
        self.used_block_ids.add(block_id)
        self.filled[block_id] = tokens
        self._live_tokens += tokens
        return block_id

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= seq.num_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a new sequence the blocks of its prompt."""
        assert not seq.block_table, "sequence already holds blocks"
        seq.block_table = [self._take(len(seq.block(i))) for i in range(seq.num_blocks)]

    def can_append(self, seq: Sequence) -> bool:
        """Whether the slot for seq's last token (appended with seq.append_token) can be reserved."""
        return len(seq.block_table) == seq.num_blocks or self.num_free_blocks > 0

    def append_slot(self, seq: Sequence) -> int:
        """Reserve the cache slot of seq's last token, opening a block when the token starts one."""
        assert len(seq.block_table) in (seq.num_blocks - 1, seq.num_blocks), "append one token at a time"
        if len(seq.block_table) < seq.num_blocks:
            seq.block_table.append(self._take(1))
        else:
            block_id = seq.block_table[-1]
            assert self.filled[block_id] == (len(seq) - 1) % self.block_size, "slot already filled"
            self.filled[block_id] += 1
            self._live_tokens += 1
        return seq.slot(len(seq) - 1)

    def free(self, seq: Sequence) -> None:
        """Give seq's blocks back to the free list, tail first."""
        for block_id in reversed(seq.block_table):
            self.used_block_ids.remove(block_id)
            self._live_tokens -= self.filled[block_id]
            self.filled[block_id] = 0
            self.free_block_ids.append(block_id)
        seq.block_table = []

    @staticmethod
    def block_tables(seqs, device=None):
        """int32 [len(seqs), max_blocks] block tables, padded with block 0 (never read past seq_len)."""
        import torch

        width = max((len(s.block_table) for s in seqs), default=0)
        table = torch.zeros(len(seqs), max(width, 1), dtype=torch.int32)
        for i, s in enumerate(seqs):
            table[i, :len(s.block_table)] = torch.tensor(s.block_table, dtype=torch.int32)
        return table.to(device) if device is not None else table
