"""A mixture-of-experts router in one Triton launch: float32 logits, scores, the group limit, top-k and
the routing weights of each token (torch runs ~9 small kernels per layer: two float casts, an sgemm,
softmax, the top-k's passes, products; ~18 us of a V2-Lite decode layer on an H200).

One program per token: logits[e] = x . W[e] in float32 (the weights read from L2 after the first
program), experts laid out [groups, experts per group] so the group limit is a reduction over rows.
Methods, as DeepSeek's presets name them (kernels/reference.py's route is the definition):
  greedy                softmax, top_k best experts (V2-Lite)
  group_limited_greedy  softmax, top_k among the topk_group groups of best expert (V2)
  noaux_tc              sigmoid + correction bias ranks, groups by the sum of their two best, top_k
                        among the topk_group best groups, weights = sigmoid scores, normalised (V3)
Ties pick the lowest expert id. Above MAX_TOKENS tokens (a prefill) the logits are one float32 GEMM
first, which the kernel reads instead of computing them.
"""
import torch
import triton
import triton.language as tl

from .dispatch import fix_triton_interpreter, next_pow2

fix_triton_interpreter()

METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}
MAX_TOKENS = 256  # above, torch's GEMM computes the logits once for all tokens


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
def _logits(x_row, w_ptr, stride_w, expert, valid, HIDDEN: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUPS_PAD: tl.constexpr, PER_PAD: tl.constexpr):
    """x . W[expert] in float32 for every expert of the [groups, per group] layout."""
    logits = tl.zeros([GROUPS_PAD, PER_PAD], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < HIDDEN
        x = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + expert[:, :, None] * stride_w + ks[None, None, :],
                    mask=valid[:, :, None] & k_mask[None, None, :], other=0.0).to(tl.float32)
        logits += tl.sum(w * x[None, None, :], 2)
    return logits


@triton.jit
def _route(x_ptr, w_ptr, logits_ptr, bias_ptr, weights_ptr, ids_ptr, stride_x, stride_w, scaling,
           HIDDEN: tl.constexpr, GROUPS: tl.constexpr, PER_GROUP: tl.constexpr,
           GROUPS_PAD: tl.constexpr, PER_PAD: tl.constexpr, TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr,
           TOPK_GROUP: tl.constexpr,
           METHOD: tl.constexpr, NORMALISE: tl.constexpr, BLOCK_K: tl.constexpr, GIVEN_LOGITS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS_PAD)
    j = tl.arange(0, PER_PAD)
    expert = g[:, None] * PER_GROUP + j[None, :]
    valid = (g[:, None] < GROUPS) & (j[None, :] < PER_GROUP)
    if GIVEN_LOGITS:  # a prefill's, from one GEMM
        logits = tl.load(logits_ptr + t * GROUPS * PER_GROUP + expert, mask=valid, other=0.0)
    else:
        logits = _logits(x_ptr + t * stride_x, w_ptr, stride_w, expert, valid, HIDDEN, BLOCK_K, GROUPS_PAD, PER_PAD)

    if METHOD == 2:
        scores = tl.sigmoid(logits)
        rank = scores + tl.load(bias_ptr + expert, mask=valid, other=0.0).to(tl.float32)
        first = _best(rank, valid, j[None, :], 1)  # each group's best, then its second best
        best1 = tl.max(tl.where(valid, rank, float("-inf")), 1)
        best2 = tl.max(tl.where(valid & (j[None, :] != first[:, None]), rank, float("-inf")), 1)
        group_score = best1 + best2
    else:
        e = tl.exp(tl.where(valid, logits, float("-inf")) - tl.max(tl.max(tl.where(valid, logits, float("-inf")), 1), 0))
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
        groups_pad, per_pad = next_pow2(groups), next_pow2(per_group)
        block_k = max(16, min(128, 8192 // (groups_pad * per_pad)))  # a [groups, per group, K] tile of ~8K
        # a prefill: one GEMM for the logits (a program per token would read the weights once per token)
        logits = torch.nn.functional.linear(x.float(), weight.float()) if num_tokens > MAX_TOKENS else None
        _route[(num_tokens,)](x, weight, weights if logits is None else logits, weight if bias is None else bias,
                              weights, ids, x.stride(0),
                              weight.stride(0), float(scaling), HIDDEN=hidden, GROUPS=groups, PER_GROUP=per_group,
                              GROUPS_PAD=groups_pad, PER_PAD=per_pad, TOP_K=top_k, TOP_K_PAD=next_pow2(top_k),
                              TOPK_GROUP=topk_group,
                              METHOD=METHODS[method], NORMALISE=normalise, BLOCK_K=block_k,
                              GIVEN_LOGITS=logits is not None, num_warps=8)
    return weights, ids
