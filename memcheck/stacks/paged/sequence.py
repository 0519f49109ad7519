"""A sequence as the block manager sees it: its token ids and the blocks that hold their K/V."""
from itertools import count


class Sequence:
    _ids = count()

    def __init__(self, token_ids, block_size: int):
        self.seq_id = next(Sequence._ids)
        self.block_size = block_size
        self.token_ids = list(token_ids)
        self.block_table: list[int] = []  # block ids, in token order

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_blocks(self) -> int:
        return -(-len(self.token_ids) // self.block_size)

    @property
    def last_block_tokens(self) -> int:
        """Tokens in the last block (block_size when it is full)."""
        return len(self.token_ids) - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        """Token ids held by the i-th block."""
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def slot(self, position: int) -> int:
        """Flat cache slot (block_id * block_size + offset) of the token at `position`."""
        return self.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def slot_mapping(self, start: int = 0, end: int | None = None) -> list[int]:
        """Slots of positions [start, end): where the K/V of those tokens must be written."""
        end = len(self.token_ids) if end is None else end
        return [self.slot(p) for p in range(start, end)]
