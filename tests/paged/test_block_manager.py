"""The block manager never hands out a block twice and never leaks one.

A hypothesis state machine drives random allocate / append / free sequences against a shadow cache: every slot a
sequence is given gets its token written, and after every step every live sequence must read its own tokens back
through its block table, and the accounting must match a recount."""
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memcheck.stacks.paged.block_manager import BlockManager
from memcheck.stacks.paged.sequence import Sequence

TOKENS = st.integers(0, 2)


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.block_size = 4
        self.bm = BlockManager(num_blocks=10, block_size=self.block_size)
        self.live: list[Sequence] = []
        self.cache: dict[int, int] = {}  # slot -> token whose K/V was written there

    @rule(tokens=st.lists(TOKENS, min_size=1, max_size=14))
    def allocate(self, tokens):
        seq = Sequence(tokens, self.block_size)
        if not self.bm.can_allocate(seq):
            assert self.bm.num_free_blocks < seq.num_blocks
            return
        self.bm.allocate(seq)
        for pos in range(len(seq)):
            self.cache[seq.slot(pos)] = seq.token_ids[pos]
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=TOKENS)
    def append(self, data, token):
        seq = data.draw(st.sampled_from(self.live))
        seq.append_token(token)
        if not self.bm.can_append(seq):  # the scheduler would preempt; the token waits
            assert self.bm.num_free_blocks == 0
            seq.token_ids.pop()
            return
        slot = self.bm.append_slot(seq)
        assert slot == seq.slot(len(seq) - 1)
        self.cache[slot] = token

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
    def each_block_has_one_holder(self):
        held = [b for seq in self.live for b in seq.block_table]
        assert len(held) == len(set(held)), "a block handed to two sequences"
        assert set(held) == self.bm.used_block_ids

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for seq in self.live:
            assert len(seq.block_table) == seq.num_blocks
            assert [self.cache.get(seq.slot(p)) for p in range(len(seq))] == seq.token_ids
            for i, block_id in enumerate(seq.block_table):
                assert self.bm.filled[block_id] == len(seq.block(i))

    @invariant()
    def accounting_matches_a_recount(self):
        bm = self.bm
        live = sum(len(seq) for seq in self.live)
        assert bm.live_tokens == live
        assert bm.reserved_tokens == bm.blocks_held * bm.block_size
        assert 0.0 <= bm.waste <= 1.0
        if bm.reserved_tokens:
            assert bm.waste == pytest.approx(1 - live / bm.reserved_tokens)

    def teardown(self):
        for seq in self.live:
            self.bm.free(seq)
        assert self.bm.blocks_held == 0 and self.bm.live_tokens == 0
        assert self.bm.num_free_blocks == self.bm.num_blocks


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=80, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


def test_freed_blocks_go_back_tail_first_and_the_oldest_freed_is_reused_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = Sequence([1, 2, 3, 4, 5], 2)
    bm.allocate(a)
    assert a.block_table == [0, 1, 2]
    bm.free(a)
    assert bm.blocks_held == 0 and bm.live_tokens == 0 and list(bm.free_block_ids) == [3, 2, 1, 0]
    b = Sequence([9], 2)
    bm.allocate(b)
    assert b.block_table == [3]


def test_slot_mapping_and_block_tables():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = Sequence(range(6), 4), Sequence(range(100, 103), 4)
    bm.allocate(a)
    bm.allocate(b)
    assert a.slot_mapping(4) == [a.block_table[1] * 4, a.block_table[1] * 4 + 1]
    table = BlockManager.block_tables([a, b])
    assert table.dtype.is_floating_point is False and table.shape == (2, 2)
    assert table[0].tolist() == a.block_table and table[1, 0].item() == b.block_table[0]


def test_waste_is_the_share_of_held_slots_without_a_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate(Sequence(range(6), 4))
    assert bm.blocks_held == 2 and bm.live_tokens == 6 and bm.reserved_tokens == 8
    assert bm.waste == pytest.approx(0.25)


def test_running_out_raises_instead_of_double_handing():
    bm = BlockManager(num_blocks=1, block_size=2)
    a = Sequence([1, 2], 2)
    bm.allocate(a)
    a.append_token(3)
    assert not bm.can_append(a)
    with pytest.raises(RuntimeError, match="out of KV-cache blocks"):
        bm.append_slot(a)
