"""The fused MoE expert kernels (Triton, under the interpreter) against the torch reference: every
token's output, with experts that get many picks, one pick or none, and both row-tile heights."""
import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DTYPES, assert_close, randn  # noqa: E402
from kernels import moe, reference  # noqa: E402


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
def test_shared_experts_output_added_to_the_routed_sum(dtype):
    """out = (sum of picks, rounded) + shared, the reference's `out += shared`. (Exact in float32 only:
    the interpreter's bf16 casts do not round ties to even as the GPU's do.)"""
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(3)
    x = randn(gen, 6, 48, dtype=dt)
    gate_up = (randn(gen, 8, 80, 48) / 7).to(dt)
    down = (randn(gen, 8, 48, 40) / 6).to(dt)
    shared = randn(gen, 6, 48, dtype=dt)
    weights, ids = routed(gen, 6, 8, 2, 8)
    with_shared = moe.fused_moe(x, gate_up, down, weights, ids, shared)
    if dt == torch.float32:
        assert torch.equal(with_shared, moe.fused_moe(x, gate_up, down, weights, ids) + shared)
    assert_close(with_shared,
                 reference.fused_moe(x.float(), gate_up.float(), down.float(), weights, ids, shared.float()))


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


@pytest.mark.parametrize("tokens,experts", [(70, 64), (9, 160), (700, 8)])
def test_sort_picks_equals_a_stable_sort(tokens, experts):
    """The one-program counting sort (several blocks of picks, padded expert counts; the last case past
    ONE_PROGRAM_SORT_PICKS through torch's sort) against torch's stable sort."""
    ids = torch.randint(0, experts, (tokens, 6), generator=torch.Generator().manual_seed(tokens))
    order, offsets = moe.sort_picks(ids, experts)
    want = ids.flatten().sort(stable=True)[1]
    assert order.tolist() == want.tolist()
    assert offsets.tolist() == torch.searchsorted(ids.flatten()[want], torch.arange(experts + 1)).tolist()
