"""Fixed-size KV-cache blocks: free list, reference counts, prefix sharing by block hash,
fork with copy-on-write, reclaim on free, and the accounting the memory metrics read.

The manager never touches tensors. It hands out block ids and cache slots; the caller writes
K/V at those slots (kernels.write_kv) and performs the block copies that copy-on-write asks for.
"""
from collections import deque

from .sequence import Sequence

NO_HASH = -1


def block_hash(token_ids, prefix_hash: int) -> int:
    """Hash of a full block, chained with the previous block's hash so equal hashes mean equal prefixes."""
    return hash((prefix_hash, tuple(token_ids)))


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "num_tokens")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.token_ids: list[int] = []  # kept for full blocks, to confirm a prefix hit
        self.num_tokens = 0  # filled slots


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # oldest freed first
        self.used_block_ids: set[int] = set()
        self.hash_to_block_id: dict[int, int] = {}
        self._live_tokens = 0

    # -- accounting ------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def blocks_held(self) -> int:
        return len(self.used_block_ids)

    @property
    def live_tokens(self) -> int:
        """Filled slots in held blocks; a shared block counts once."""
        return self._live_tokens

    @property
    def reserved_tokens(self) -> int:
        return self.blocks_held * self.block_size

    @property
    def waste(self) -> float:
        """1 - live/reserved: the share of held slots that hold no token."""
        return 1.0 - self._live_tokens / self.reserved_tokens if self.used_block_ids else 0.0

    # -- one block ---------------------------------------------------------------------------
    def _take(self, block_id: int | None = None) -> Block:
        """Hold a free block: the oldest freed one, or a given one revived by a prefix hit."""
        if block_id is None:
            if not self.free_block_ids:
                raise RuntimeError("out of KV-cache blocks: call can_allocate/can_append first")
            block = self.blocks[self.free_block_ids.popleft()]
            self._forget(block)  # its old content is about to be overwritten
        else:
            self.free_block_ids.remove(block_id)
            block = self.blocks[block_id]
            self._live_tokens += block.num_tokens
        assert block.ref_count == 0, f"block {block.block_id} handed out twice"
        block.ref_count = 1
        self.used_block_ids.add(block.block_id)
        return block

    def _forget(self, block: Block) -> None:
        if self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.num_tokens = NO_HASH, [], 0

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:  # reclaimed; hash and content stay for later prefix hits
            self.used_block_ids.remove(block_id)
            self._live_tokens -= block.num_tokens
            self.free_block_ids.append(block_id)

    def _seal(self, block: Block, token_ids: list[int], prefix_hash: int) -> None:
        """Register a block that just became full, so later prompts can share it."""
        if self.prefix_caching:
            block.hash = block_hash(token_ids, prefix_hash)
            block.token_ids = list(token_ids)
            self.hash_to_block_id[block.hash] = block.block_id

    def _prefix_hash(self, seq: Sequence, i: int) -> int:
        return self.blocks[seq.block_table[i - 1]].hash if i > 0 else NO_HASH

    # -- sequences ---------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= seq.num_blocks  # conservative: ignores prefix hits

    def allocate(self, seq: Sequence) -> None:
        """Give a new sequence its blocks, sharing full blocks whose prefix is cached.
        Afterwards seq.num_cached_tokens leading tokens already have K/V in the cache."""
        assert not seq.block_table, "sequence already holds blocks"
        hit = self.prefix_caching
        for i in range(seq.num_blocks):
            tokens = seq.block(i)
            prefix = self._prefix_hash(seq, i)
            # A block holding the last token is always recomputed, so every prompt has a new token.
            if hit and (i + 1) * self.block_size < len(seq):
                block_id = self.hash_to_block_id.get(block_hash(tokens, prefix), -1)
                hit = block_id != -1 and self.blocks[block_id].token_ids == tokens
            else:
                hit = False
            if hit:
                if block_id in self.used_block_ids:
                    self.blocks[block_id].ref_count += 1
                else:
                    self._take(block_id)
                seq.num_cached_tokens += self.block_size
            else:
                block = self._take()
                block.num_tokens = len(tokens)
                self._live_tokens += len(tokens)
                block_id = block.block_id
                if len(tokens) == self.block_size:
                    self._seal(block, tokens, prefix)
            seq.block_table.append(block_id)

    def _append_needs_block(self, seq: Sequence) -> bool:
        if len(seq.block_table) < seq.num_blocks:
            return True  # the new token opens a block
        return self.blocks[seq.block_table[-1]].ref_count > 1  # copy-on-write of a shared block

    def can_append(self, seq: Sequence) -> bool:
        """Whether the slot for seq's last token (appended with seq.append_token) can be reserved."""
        return self.num_free_blocks >= int(self._append_needs_block(seq))

    def append_slot(self, seq: Sequence) -> tuple[int, tuple[int, int] | None]:
        """Reserve the cache slot of seq's last token. Returns (slot, copy): copy is
        (src_block, dst_block) when a shared block was copied on write; the caller copies
        that block's K/V before writing the new token."""
        assert len(seq.block_table) in (seq.num_blocks - 1, seq.num_blocks), "append one token at a time"
        copy = None
        if len(seq.block_table) < seq.num_blocks:
            block = self._take()
            seq.block_table.append(block.block_id)
        else:
            block = self.blocks[seq.block_table[-1]]
            if block.ref_count > 1:
                new = self._take()
                new.num_tokens = block.num_tokens
                self._live_tokens += block.num_tokens
                block.ref_count -= 1
                seq.block_table[-1] = new.block_id
                copy, block = (block.block_id, new.block_id), new
        assert block.num_tokens == (len(seq) - 1) % self.block_size, "slot already filled"
        block.num_tokens += 1
        self._live_tokens += 1
        if block.num_tokens == self.block_size:
            i = len(seq.block_table) - 1
            self._seal(block, seq.block(i), self._prefix_hash(seq, i))
        return seq.slot(len(seq) - 1), copy

    def fork(self, seq: Sequence) -> Sequence:
        """A child sharing every block of seq; a shared partial block is copied on the next write."""
        assert len(seq.block_table) == seq.num_blocks, "reserve the last token's slot before forking"
        child = Sequence(seq.token_ids, seq.block_size)
        child.block_table = list(seq.block_table)
        child.num_cached_tokens = seq.num_cached_tokens
        for block_id in child.block_table:
            self.blocks[block_id].ref_count += 1
        return child

    def free(self, seq: Sequence) -> None:
        """Drop seq's blocks; those no one else holds go back to the free list, tail first."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_cached_tokens = 0

    @staticmethod
    def block_tables(seqs, device=None):
        """int32 [len(seqs), max_blocks] block tables, padded with block 0 (never read past seq_len)."""
        import torch

        width = max((len(s.block_table) for s in seqs), default=0)
        table = torch.zeros(len(seqs), max(width, 1), dtype=torch.int32)
        for i, s in enumerate(seqs):
            table[i, :len(s.block_table)] = torch.tensor(s.block_table, dtype=torch.int32)
        return table.to(device) if device is not None else table
