"""The one-launch MoE router (Triton, under the interpreter) against the torch reference for DeepSeek's three
routing methods: the same experts per token and the same weights, for decode-sized batches (logits in the
kernel) and prefill-sized ones (logits from one GEMM)."""
import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import randn  # noqa: E402
from memcheck.kernels import reference, router  # noqa: E402

# (method, experts, top_k, n_group, topk_group, normalise, scaling): V2-Lite, V2, V3 shapes at small width
CASES = {
    "greedy": ("greedy", 64, 6, 1, 1, False, 1.0),
    "group_limited_greedy": ("group_limited_greedy", 160, 6, 8, 3, False, 16.0),
    "noaux_tc": ("noaux_tc", 256, 8, 8, 4, True, 2.5),
    "greedy_normalised_odd_experts": ("greedy", 12, 3, 1, 1, True, 1.0),
}


def route_both(case, tokens, hidden=40, dtype=torch.float32):
    method, experts, top_k, n_group, topk_group, normalise, scaling = CASES[case]
    gen = torch.Generator().manual_seed(tokens + experts)
    x = randn(gen, tokens, hidden, dtype=dtype)
    weight = (randn(gen, experts, hidden) / hidden ** 0.5).to(dtype)
    bias = torch.rand(experts, generator=gen) * 0.1 if method == "noaux_tc" else None
    args = dict(method=method, top_k=top_k, n_group=n_group, topk_group=topk_group, normalise=normalise,
                scaling=scaling)
    return router.route(x, weight, bias, **args), reference.route(x, weight, bias, **args)


def by_expert(weights, ids):
    """Each token's picks as {expert: weight}: the order of the top-k is not part of the answer."""
    return [dict(zip(i.tolist(), w.tolist())) for w, i in zip(weights, ids)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tokens", [1, 5, 20])  # 20: two blocks of 16 tokens for the logits
def test_same_experts_and_weights_as_the_reference(case, tokens):
    (w, ids), (ref_w, ref_ids) = route_both(case, tokens)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and w.shape == ref_w.shape
    got, want = by_expert(w, ids), by_expert(ref_w, ref_ids)
    assert [sorted(g) for g in got] == [sorted(r) for r in want]
    for g, r in zip(got, want):
        assert all(abs(g[e] - r[e]) <= 1e-5 * max(1.0, abs(r[e])) for e in r)


def test_group_limit_keeps_every_pick_inside_the_best_groups():
    (w, ids), _ = route_both("group_limited_greedy", 4)
    per_group = CASES["group_limited_greedy"][1] // 8
    for row in ids.tolist():
        assert len({e // per_group for e in row}) <= CASES["group_limited_greedy"][4]


def test_prefill_sized_batch_takes_the_logits_from_one_gemm(monkeypatch):
    monkeypatch.setattr(router, "MAX_TOKENS", 3)
    (w, ids), (ref_w, ref_ids) = route_both("noaux_tc", 6)
    assert [sorted(g) for g in by_expert(w, ids)] == [sorted(r) for r in by_expert(ref_w, ref_ids)]


def test_bf16_activations_route_like_their_float32_values():
    (w, ids), (ref_w, ref_ids) = route_both("greedy", 3, dtype=torch.bfloat16)
    assert [sorted(g) for g in by_expert(w, ids)] == [sorted(r) for r in by_expert(ref_w, ref_ids)]
