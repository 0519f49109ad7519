"""Mixture-of-experts feed-forward (DeepSeek-V2/V3): a router picks top_k routed experts per token,
their weighted outputs add to the shared experts' output.

Routing follows the preset: greedy (softmax, top-k: V2-Lite), group_limited_greedy (softmax, top-k
inside the best groups: V2), noaux_tc (sigmoid plus correction bias, groups ranked by their top-2
sum, normalised weights: V3), in kernels.route. Expert weights keep transformers' fused layout: gate_up_proj
[experts, 2 x moe_intermediate, hidden], down_proj [experts, hidden, moe_intermediate], run by
kernels.fused_moe."""
from __future__ import annotations

import torch
from torch import nn

from memcheck import kernels

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
        bias = self.e_score_correction_bias if s.topk_method == "noaux_tc" else None
        return kernels.route(x, self.weight, bias, method=s.topk_method, top_k=s.top_k, n_group=s.n_group,
                             topk_group=s.topk_group, normalise=s.norm_topk_prob, scaling=s.routed_scaling_factor)


class Experts(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(spec.n_routed_experts, 2 * spec.moe_intermediate, spec.hidden))
        self.down_proj = nn.Parameter(torch.empty(spec.n_routed_experts, spec.hidden, spec.moe_intermediate))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, shared=None) -> torch.Tensor:
        """Picks sorted by expert: the fused Triton kernels on CUDA (no host sync; the shared experts' weights
        `shared`, if given, as more experts every token picks), the torch reference (a loop over experts) on
        the CPU."""
        return kernels.fused_moe(x, self.gate_up_proj, self.down_proj, weights, ids, *(shared or (None, None)))


class MoE(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate = Router(spec)
        self.experts = Experts(spec)
        shared = spec.moe_intermediate * spec.n_shared_experts
        self.shared_experts = GatedMLP(spec.hidden, shared, bias=spec.mlp_bias) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        shared = self.shared_experts
        fused = shared.fused_weights() if shared is not None else None
        if fused is not None or shared is None:
            return self.experts(x, weights, ids, fused)
        return self.experts(x, weights, ids).add_(shared(x))  # unfused: transformers' order
