"""A mixture-of-experts router in two Triton launches: float32 logits, then per token the scores, the
group limit, top-k and the routing weights (torch runs ~9 small kernels per layer: two float casts, an
sgemm, softmax, the top-k's passes, products; ~22 us of a V2-Lite decode layer on an H200).

Logits: a program per (expert, 16 tokens), so the router's weights spread over the GPU. Routing: a program
per token, experts laid out [groups, experts per group] so the group limit is a reduction over rows.
Methods, as DeepSeek's presets name them (memcheck/kernels/reference.py's route is the definition):
  greedy                softmax, top_k best experts (V2-Lite)
  group_limited_greedy  softmax, top_k among the topk_group groups of best expert (V2)
  noaux_tc              sigmoid + correction bias ranks, groups by the sum of their two best, top_k
                        among the topk_group best groups, weights = sigmoid scores, normalised (V3)
Ties pick the lowest expert id. Above MAX_TOKENS tokens (a prefill) the logits are one float32 GEMM.
"""
import torch
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2

fix_triton_interpreter()

METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}
MAX_TOKENS = 256  # above, torch's GEMM computes the logits once for all tokens
LOGITS_TOKENS, LOGITS_K = 16, 256  # a [16 tokens, 256] float32 tile of products per step


@triton.jit
def _best(values, valid, lowest, axis: tl.constexpr):
    """Per row (or overall for 1-D) of `values`: the index along `axis` of the largest valid value
    (the lowest index among equals)."""
    v = tl.where(valid, values, float("-inf"))
    top = tl.max(v, axis)
    if axis == 0:
        return tl.min(tl.where(v == top, lowest, 1 << 30), 0)
    return tl.min(tl.where(v == tl.expand_dims(top, axis), lowest, 1 << 30), axis)


@triton.jit
def _router_logits(x_ptr, w_ptr, logits_ptr, num_tokens, stride_x, stride_w, num_experts,
                   HIDDEN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """logits[t, e] = x[t] . W[e] in float32 for BLOCK_T tokens and one expert: a program per (expert, token
    block) spreads the weights over the GPU (one program per token would stream them all through one SM)."""
    e = tl.program_id(0)
    tokens = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = tokens < num_tokens
    acc = tl.zeros([BLOCK_T, BLOCK_K], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < HIDDEN
        x = tl.load(x_ptr + tokens.to(tl.int64)[:, None] * stride_x + ks[None, :],
                    mask=t_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + e.to(tl.int64) * stride_w + ks, mask=k_mask, other=0.0).to(tl.float32)
        acc += x * w[None, :]
    tl.store(logits_ptr + tokens * num_experts + e, tl.sum(acc, 1), mask=t_mask)


@triton.jit
def _route(logits_ptr, bias_ptr, weights_ptr, ids_ptr, scaling, GROUPS: tl.constexpr, PER_GROUP: tl.constexpr,
           GROUPS_PAD: tl.constexpr, PER_PAD: tl.constexpr, TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr,
           TOPK_GROUP: tl.constexpr,
           METHOD: tl.constexpr, NORMALISE: tl.constexpr):
    """One token's routing from its float32 logits."""
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS_PAD)
    j = tl.arange(0, PER_PAD)
    expert = g[:, None] * PER_GROUP + j[None, :]
    valid = (g[:, None] < GROUPS) & (j[None, :] < PER_GROUP)
    logits = tl.load(logits_ptr + t * GROUPS * PER_GROUP + expert, mask=valid, other=0.0)

    if METHOD == 2:
        scores = tl.sigmoid(logits)
        rank = scores + tl.load(bias_ptr + expert, mask=valid, other=0.0).to(tl.float32)
        first = _best(rank, valid, j[None, :], 1)  # each group's best, then its second best
        best1 = tl.max(tl.where(valid, rank, float("-inf")), 1)
        best2 = tl.max(tl.where(valid & (j[None, :] != first[:, None]), rank, float("-inf")), 1)
        group_score = best1 + best2
    else:
        masked = tl.where(valid, logits, float("-inf"))
        e = tl.exp(masked - tl.max(tl.max(masked, 1), 0))
        scores = e / tl.sum(tl.sum(e, 1), 0)
        rank = scores
        group_score = tl.max(tl.where(valid, scores, float("-inf")), 1)

    if METHOD != 0:  # keep the topk_group best groups
        kept = tl.zeros([GROUPS_PAD], tl.int1)
        open_groups = g < GROUPS
        for _ in tl.static_range(TOPK_GROUP):
            best = _best(group_score, open_groups & ~kept, g, 0)
            kept = kept | (g == best)
        valid = valid & kept[:, None]

    flat = tl.arange(0, TOP_K_PAD)
    picked_w = tl.zeros([TOP_K_PAD], tl.float32)
    picked_id = tl.zeros([TOP_K_PAD], tl.int32)
    for i in tl.static_range(TOP_K):
        top = tl.max(tl.max(tl.where(valid, rank, float("-inf")), 1), 0)
        pick = tl.min(tl.min(tl.where(valid & (rank == top), expert, 1 << 30), 1), 0)
        here = expert == pick
        picked_w = tl.where(flat == i, tl.sum(tl.sum(tl.where(here, scores, 0.0), 1), 0), picked_w)
        picked_id = tl.where(flat == i, pick, picked_id)
        valid = valid & ~here
    if NORMALISE:
        picked_w = picked_w / (tl.sum(picked_w, 0) + 1e-20)
    tl.store(weights_ptr + t * TOP_K + flat, picked_w * scaling, mask=flat < TOP_K)
    tl.store(ids_ptr + t * TOP_K + flat, picked_id, mask=flat < TOP_K)


def route(x, weight, bias, *, method, top_k, n_group, topk_group, normalise, scaling):
    """x [T, hidden]; weight [experts, hidden]; bias [experts] (noaux_tc) or None -> (weights [T, top_k]
    float32, scaling included; ids [T, top_k] int32)."""
    num_tokens, hidden = x.shape
    experts = weight.shape[0]
    groups = n_group if method != "greedy" else 1
    per_group = experts // groups
    weights = torch.empty(num_tokens, top_k, device=x.device, dtype=torch.float32)
    ids = torch.empty(num_tokens, top_k, device=x.device, dtype=torch.int32)
    if num_tokens:
        assert x.stride(-1) == 1 and weight.stride(-1) == 1
        if num_tokens > MAX_TOKENS:  # a prefill: one GEMM (a program per expert would re-read every token)
            logits = torch.nn.functional.linear(x.float(), weight.float())
        else:
            logits = torch.empty(num_tokens, experts, device=x.device, dtype=torch.float32)
            _router_logits[(experts, triton.cdiv(num_tokens, LOGITS_TOKENS))](
                x, weight, logits, num_tokens, x.stride(0), weight.stride(0), experts,
                HIDDEN=hidden, BLOCK_T=LOGITS_TOKENS, BLOCK_K=LOGITS_K, num_warps=4)
        _route[(num_tokens,)](logits, weight if bias is None else bias, weights, ids, float(scaling),
                              GROUPS=groups, PER_GROUP=per_group, GROUPS_PAD=next_pow2(groups),
                              PER_PAD=next_pow2(per_group), TOP_K=top_k, TOP_K_PAD=next_pow2(top_k),
                              TOPK_GROUP=topk_group, METHOD=METHODS[method], NORMALISE=normalise, num_warps=4)
    return weights, ids
