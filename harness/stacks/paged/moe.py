"""Mixture-of-experts feed-forward (DeepSeek-V2/V3): a router picks top_k routed experts per token,
their weighted outputs add to the shared experts' output.

Routing follows the preset: greedy (softmax, top-k: V2-Lite), group_limited_greedy (softmax, top-k
inside the best groups: V2), noaux_tc (sigmoid plus correction bias, groups ranked by their top-2
sum, normalised weights: V3). Expert weights keep transformers' fused layout: gate_up_proj
[experts, 2 x moe_intermediate, hidden], down_proj [experts, hidden, moe_intermediate], run by
kernels.fused_moe."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import kernels

from .config import ModelSpec
from .layers import GatedMLP


class Router(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.n_routed_experts, spec.hidden))
        if spec.topk_method == "noaux_tc":
            self.register_buffer("e_score_correction_bias", torch.empty(spec.n_routed_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, top_k] float32, expert ids [T, top_k])."""
        s = self.spec
        logits = F.linear(x.float(), self.weight.float())
        if s.topk_method == "noaux_tc":
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias
            group_scores = choice.view(-1, s.n_group, s.n_routed_experts // s.n_group).topk(2, dim=-1)[0].sum(-1)
            choice = choice.masked_fill(~self._group_mask(group_scores), float("-inf"))
            ids = choice.topk(s.top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, ids)
            if s.norm_topk_prob:
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        else:
            scores = logits.softmax(-1)
            if s.topk_method == "group_limited_greedy":
                group_scores = scores.view(-1, s.n_group, s.n_routed_experts // s.n_group).max(-1).values
                scores = scores.masked_fill(~self._group_mask(group_scores), 0.0)
            weights, ids = scores.topk(s.top_k, dim=-1, sorted=False)
        return weights * s.routed_scaling_factor, ids

    def _group_mask(self, group_scores: torch.Tensor) -> torch.Tensor:
        """[T, experts] bool: experts of each token's topk_group best groups."""
        s = self.spec
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(s.topk_group, dim=-1, sorted=False)[1], True)
        return keep.repeat_interleave(s.n_routed_experts // s.n_group, dim=1)


class Experts(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(spec.n_routed_experts, 2 * spec.moe_intermediate, spec.hidden))
        self.down_proj = nn.Parameter(torch.empty(spec.n_routed_experts, spec.hidden, spec.moe_intermediate))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Picks sorted by expert: the fused Triton kernels on CUDA (two launches, no host sync), the
        torch reference (a loop over experts) on the CPU."""
        return kernels.fused_moe(x, self.gate_up_proj, self.down_proj, weights, ids)


class MoE(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate = Router(spec)
        self.experts = Experts(spec)
        shared = spec.moe_intermediate * spec.n_shared_experts
        self.shared_experts = GatedMLP(spec.hidden, shared, bias=spec.mlp_bias) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out += self.shared_experts(x)
        return out
