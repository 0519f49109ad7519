"""The block manager never hands out a block twice and never leaks one.

A hypothesis state machine drives random allocate / append / fork / free sequences (with prompts
drawn from earlier ones, so prefix hits happen) against a shadow cache: every slot a sequence is
given gets its token written, copy-on-write copies are applied, and after every step every live
sequence must read its own tokens back through its block table, the reference counts must equal
the holders, and the accounting must match a recount."""
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memcheck.stacks.paged.block_manager import NO_HASH, BlockManager
from memcheck.stacks.paged.sequence import Sequence

TOKENS = st.integers(0, 2)  # few distinct tokens: equal blocks, hence prefix hits, are common


class BlockManagerMachine(RuleBasedStateMachine):
    prefix_caching = True

    def __init__(self):
        super().__init__()
        self.block_size = 4
        self.bm = BlockManager(num_blocks=10, block_size=self.block_size, prefix_caching=self.prefix_caching)
        self.live: list[Sequence] = []
        self.prompts: list[list[int]] = []
        self.cache: dict[int, int] = {}  # slot -> token whose K/V was written there

    def _write_new(self, seq):
        for pos in range(seq.num_cached_tokens, len(seq)):
            self.cache[seq.slot(pos)] = seq.token_ids[pos]

    def _allocate(self, tokens):
        seq = Sequence(tokens, self.block_size)
        if not self.bm.can_allocate(seq):
            assert self.bm.num_free_blocks < seq.num_blocks
            return
        self.bm.allocate(seq)
        assert seq.num_cached_tokens % self.block_size == 0 and seq.num_cached_tokens < len(seq)
        if not self.prefix_caching:
            assert seq.num_cached_tokens == 0
        self._write_new(seq)
        self.live.append(seq)
        self.prompts.append(list(tokens))

    @rule(tokens=st.lists(TOKENS, min_size=1, max_size=14))
    def allocate(self, tokens):
        self._allocate(tokens)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data(), extra=st.lists(TOKENS, max_size=6))
    def allocate_shared_prefix(self, data, extra):
        prompt = data.draw(st.sampled_from(self.prompts))
        cut = data.draw(st.integers(1, len(prompt)))
        self._allocate(prompt[:cut] + extra)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=TOKENS)
    def append(self, data, token):
        seq = data.draw(st.sampled_from(self.live))
        seq.append_token(token)
        if not self.bm.can_append(seq):  # the scheduler would preempt; the token waits
            assert self.bm.num_free_blocks == 0
            seq.token_ids.pop()
            return
        slot, copy = self.bm.append_slot(seq)
        if copy is not None:
            src, dst = copy
            for off in range(self.block_size):
                if src * self.block_size + off in self.cache:
                    self.cache[dst * self.block_size + off] = self.cache[src * self.block_size + off]
        assert slot == seq.slot(len(seq) - 1)
        self.cache[slot] = token

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        self.live.append(self.bm.fork(data.draw(st.sampled_from(self.live))))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.free(seq)
        assert seq.block_table == []

    @invariant()
    def blocks_are_held_or_free_never_both(self):
        free = list(self.bm.free_block_ids)
        assert len(free) == len(set(free)), "a block is in the free list twice"
        assert not set(free) & self.bm.used_block_ids, "a block is both free and held"
        assert set(free) | self.bm.used_block_ids == set(range(self.bm.num_blocks)), "a block leaked"

    @invariant()
    def reference_counts_equal_holders(self):
        holders = {}
        for seq in self.live:
            assert len(seq.block_table) == len(set(seq.block_table)), "a block twice in one table"
            for block_id in seq.block_table:
                holders[block_id] = holders.get(block_id, 0) + 1
        for block in self.bm.blocks:
            assert block.ref_count == holders.get(block.block_id, 0)
            assert (block.ref_count > 0) == (block.block_id in self.bm.used_block_ids)

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for seq in self.live:
            assert len(seq.block_table) == seq.num_blocks
            assert [self.cache.get(seq.slot(p)) for p in range(len(seq))] == seq.token_ids
            for i, block_id in enumerate(seq.block_table):
                assert self.bm.blocks[block_id].num_tokens == len(seq.block(i))

    @invariant()
    def accounting_matches_a_recount(self):
        bm = self.bm
        live = sum(bm.blocks[b].num_tokens for b in bm.used_block_ids)
        assert bm.live_tokens == live
        assert bm.blocks_held == len(bm.used_block_ids)
        assert bm.reserved_tokens == bm.blocks_held * bm.block_size
        assert 0.0 <= bm.waste <= 1.0
        if bm.reserved_tokens:
            assert bm.waste == pytest.approx(1 - live / bm.reserved_tokens)

    @invariant()
    def hashes_point_at_their_blocks(self):
        for h, block_id in self.bm.hash_to_block_id.items():
            block = self.bm.blocks[block_id]
            assert block.hash == h != NO_HASH and len(block.token_ids) == self.bm.block_size

    def teardown(self):
        for seq in self.live:
            self.bm.free(seq)
        assert self.bm.blocks_held == 0 and self.bm.live_tokens == 0
        assert self.bm.num_free_blocks == self.bm.num_blocks


class BlockManagerNoPrefixCaching(BlockManagerMachine):
    prefix_caching = False


SETTINGS = settings(max_examples=80, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = SETTINGS
TestBlockManagerNoPrefixCaching = BlockManagerNoPrefixCaching.TestCase
TestBlockManagerNoPrefixCaching.settings = SETTINGS


def test_prefix_hit_shares_full_blocks_and_recomputes_the_last():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = Sequence(range(10), 4)
    bm.allocate(a)
    b = Sequence(list(range(8)) + [42], 4)
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    c = Sequence(range(8), 4)  # the whole prompt cached: its last block is still computed
    bm.allocate(c)
    assert c.num_cached_tokens == 4 and c.block_table[1] != a.block_table[1]


def test_freed_blocks_are_reclaimed_and_still_serve_prefix_hits():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = Sequence([1, 2, 3, 4, 5], 2)
    bm.allocate(a)
    held = list(a.block_table)
    bm.free(a)
    assert bm.blocks_held == 0 and bm.num_free_blocks == 4 and bm.live_tokens == 0
    b = Sequence([1, 2, 3, 4, 9], 2)
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[:2] == held[:2]


def test_fork_copies_a_shared_partial_block_on_write():
    bm = BlockManager(num_blocks=6, block_size=4)
    parent = Sequence([7, 7, 7, 7, 7, 7], 4)
    bm.allocate(parent)
    child = bm.fork(parent)
    assert child.block_table == parent.block_table and bm.blocks_held == 2
    parent.append_token(1)
    slot, copy = bm.append_slot(parent)
    assert copy == (child.block_table[1], parent.block_table[1]) and slot == parent.block_table[1] * 4 + 2
    child.append_token(2)
    assert bm.append_slot(child)[1] is None  # the old block is the child's alone now
    assert bm.blocks_held == 3 and bm.live_tokens == 4 + 3 + 3


def test_accounting_counts_shared_blocks_once():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = Sequence(range(6), 4)
    bm.allocate(a)
    bm.fork(a)
    assert bm.blocks_held == 2 and bm.live_tokens == 6 and bm.reserved_tokens == 8
    assert bm.waste == pytest.approx(0.25)


def test_slot_mapping_and_block_tables():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = Sequence(range(6), 4), Sequence(range(100, 103), 4)
    bm.allocate(a)
    bm.allocate(b)
    assert a.slot_mapping(4) == [a.block_table[1] * 4, a.block_table[1] * 4 + 1]
    table = BlockManager.block_tables([a, b])
    assert table.dtype.is_floating_point is False and table.shape == (2, 2)
    assert table[0].tolist() == a.block_table and table[1, 0].item() == b.block_table[0]


def test_running_out_raises_instead_of_double_handing():
    bm = BlockManager(num_blocks=1, block_size=2)
    a = Sequence([1, 2], 2)
    bm.allocate(a)
    a.append_token(3)
    assert not bm.can_append(a)
    with pytest.raises(RuntimeError, match="out of KV-cache blocks"):
        bm.append_slot(a)
