"""The fused MoE expert kernels (Triton, under the interpreter) against the torch reference: every
token's output, with experts that get many picks, one pick or none, and both row-tile heights."""
import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DTYPES, assert_close, randn  # noqa: E402
from memcheck.kernels import moe, reference  # noqa: E402


def routed(gen, tokens, experts, top_k, skew):
    """Routing of `tokens` tokens: distinct experts per token, drawn from the first `skew` experts."""
    ids = torch.stack([torch.randperm(skew, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen) * 2.5
    return weights, ids


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tokens,experts,top_k,skew", [(5, 8, 2, 8), (3, 8, 3, 4), (40, 4, 2, 4)])
def test_fused_moe_matches_reference(tokens, experts, top_k, skew, dtype):
    gen = torch.Generator().manual_seed(tokens * 100 + experts)
    dt = DTYPES[dtype]
    hidden, inter = 48, 40  # neither a multiple of the tiles: masked edges on both products
    x = randn(gen, tokens, hidden, dtype=dt)
    gate_up = (randn(gen, experts, 2 * inter, hidden) / hidden ** 0.5).to(dt)
    down = (randn(gen, experts, hidden, inter) / inter ** 0.5).to(dt)
    weights, ids = routed(gen, tokens, experts, top_k, skew)
    ref = reference.fused_moe(x.float(), gate_up.float(), down.float(), weights, ids)
    out = moe.fused_moe(x, gate_up, down, weights, ids)
    assert out.dtype == dt and out.shape == x.shape
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shared", [1, 2])
def test_shared_experts_run_as_experts_every_token_picks(shared, dtype):
    """The shared experts' gated MLP (fused gate/up rows: S gate blocks, then S up blocks) through the same
    kernels as S more picks of weight 1: the reference adds it after the routed sum, as transformers does."""
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(3 + shared)
    hidden, inter = 48, 40
    x = randn(gen, 6, hidden, dtype=dt)
    gate_up = (randn(gen, 8, 2 * inter, hidden) / 7).to(dt)
    down = (randn(gen, 8, hidden, inter) / 6).to(dt)
    shared_gate_up = (randn(gen, 2 * shared * inter, hidden) / 7).to(dt)
    shared_down = (randn(gen, hidden, shared * inter) / 6).to(dt)
    weights, ids = routed(gen, 6, 8, 2, 8)
    out = moe.fused_moe(x, gate_up, down, weights, ids, shared_gate_up, shared_down)
    ref = reference.fused_moe(x.float(), gate_up.float(), down.float(), weights, ids, shared_gate_up.float(),
                              shared_down.float())
    assert_close(out, ref)
    routed_only = reference.fused_moe(x.float(), gate_up.float(), down.float(), weights, ids)
    assert (ref - routed_only).abs().max() > 0.1  # the shared part is not negligible: the test can fail


def test_shared_experts_in_a_prefill_sized_batch_take_torch_sort(monkeypatch):
    monkeypatch.setattr(moe, "ONE_PROGRAM_SORT_PICKS", 8)
    gen = torch.Generator().manual_seed(9)
    x = randn(gen, 5, 32)
    gate_up, down = randn(gen, 4, 64, 32) / 6, randn(gen, 4, 32, 32) / 6
    shared_gate_up, shared_down = randn(gen, 64, 32) / 6, randn(gen, 32, 32) / 6
    weights, ids = routed(gen, 5, 4, 2, 4)
    assert_close(moe.fused_moe(x, gate_up, down, weights, ids, shared_gate_up, shared_down),
                 reference.fused_moe(x, gate_up, down, weights, ids, shared_gate_up, shared_down))


def test_tall_row_tiles_when_experts_get_many_picks():
    """40 tokens x 2 picks over 4 experts (20 each) take the 64-row tiles; the result is the same."""
    gen = torch.Generator().manual_seed(1)
    x = randn(gen, 80, 32)
    gate_up, down = randn(gen, 2, 64, 32) / 6, randn(gen, 2, 32, 32) / 6
    weights, ids = routed(gen, 80, 2, 1, 2)
    assert 80 >= moe.TALL_PICKS_PER_EXPERT * 2
    assert_close(moe.fused_moe(x, gate_up, down, weights, ids), reference.fused_moe(x, gate_up, down, weights, ids))


def test_sort_picks_groups_by_expert():
    ids = torch.tensor([[3, 0], [0, 2], [3, 1]])
    order, offsets = moe.sort_picks(ids, 5)
    assert offsets.tolist() == [0, 2, 3, 4, 6, 6]  # expert 4: no picks
    assert ids.flatten()[order].tolist() == [0, 0, 1, 2, 3, 3]
    assert order.tolist() == [1, 2, 5, 3, 0, 4]  # stable: picks of one expert in token order


def test_sort_picks_adds_each_tokens_shared_picks():
    """Two shared experts (5 and 6): picks 2, 3 of each token's four, after its two routed ones."""
    ids = torch.tensor([[3, 0], [0, 2], [3, 1]])
    order, offsets = moe.sort_picks(ids, 5, shared=2)
    assert offsets.tolist() == [0, 2, 3, 4, 6, 6, 9, 12]
    assert order.tolist() == [1, 4, 9, 5, 0, 8, 2, 6, 10, 3, 7, 11]


@pytest.mark.parametrize("tokens,experts", [(70, 64), (9, 160), (700, 8)])
def test_sort_picks_equals_a_stable_sort(tokens, experts):
    """The one-program counting sort (several blocks of picks, padded expert counts; the last case past
    ONE_PROGRAM_SORT_PICKS through torch's sort) against torch's stable sort."""
    ids = torch.randint(0, experts, (tokens, 6), generator=torch.Generator().manual_seed(tokens))
    order, offsets = moe.sort_picks(ids, experts)
    want = ids.flatten().sort(stable=True)[1]
    assert order.tolist() == want.tolist()
    assert offsets.tolist() == torch.searchsorted(ids.flatten()[want], torch.arange(experts + 1)).tolist()
