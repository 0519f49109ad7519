"""Building blocks shared by every family: RMSNorm, the SiLU-gated MLP, rotary embeddings.

Each computes what its transformers counterpart computes, in the same dtypes, so the paged model and
the `hf` model agree to rounding."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memcheck import kernels


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """With residual: x += residual first (in place), in the same launch on CUDA."""
        return kernels.rms_norm(x, self.weight, self.eps, residual)


class Linear(nn.Linear):
    """nn.Linear through kernels.linear: a graph-captured decode step's few rows read the weight with the skinny
    GEMM where this GPU has a measured tile for the product, cuBLAS otherwise; F.linear on the CPU (same numbers
    as nn.Linear)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.weight, self.bias)


def fused_linear(*linears: nn.Linear) -> nn.Linear:
    """One linear layer whose output is the given layers' outputs side by side (one matrix product
    instead of several). Their weights are concatenated; the originals go with their modules."""
    out = sum(lin.weight.shape[0] for lin in linears)  # a tensor-parallel shard's rows, not out_features
    bias = linears[0].bias is not None
    with torch.device("meta"):
        fused = Linear(linears[0].in_features, out, bias=bias)
    fused.weight = nn.Parameter(torch.cat([lin.weight for lin in linears]), requires_grad=False)
    if bias:
        fused.bias = nn.Parameter(torch.cat([lin.bias for lin in linears]), requires_grad=False)
    return fused


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), the activation and product done in place (two intermediate rows live, not four).
    After fuse(), gate and up are one projection (gate_up_proj: [gate; up] rows)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=bias)
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.gate_up_proj = None

    def fuse(self) -> None:
        self.gate_up_proj = fused_linear(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def fused_weights(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(gate_up [2 x intermediate, hidden], down [hidden, intermediate]) once fused and without biases:
        what kernels.fused_moe runs as shared experts; else None."""
        if self.gate_up_proj is None or self.gate_up_proj.bias is not None or self.down_proj.bias is not None:
            return None
        return self.gate_up_proj.weight, self.down_proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            h = F.silu(self.gate_proj(x), inplace=True)
            h.mul_(self.up_proj(x))
        else:  # h: the gate half of [gate, up] rows, a strided view the down projection reads in place
            h = kernels.silu_mul_(self.gate_up_proj(x))
        return self.down_proj(h)


class Rotary:
    """Rotary position embedding with the inverse frequencies and attention scaling of the transformers
    model (yarn included), taken from its rotary module rather than recomputed.

    neox: rotate halves (Llama, Qwen2), in the model dtype as transformers does.
    interleaved: rotate (even, odd) pairs (DeepSeek), in float32; the result is laid out evens then
    odds, a fixed permutation of the pair layout that leaves every q.k product unchanged."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, interleaved: bool):
        self.inv_freq, self.scaling, self.interleaved = inv_freq.float(), float(scaling), interleaved

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]  # [T, D/2]
        cos, sin = freqs.cos() * self.scaling, freqs.sin() * self.scaling
        if not self.interleaved:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos, sin

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] -> rotated, same shape and dtype (one launch on CUDA)."""
        return kernels.apply_rotary(x, cos, sin, self.interleaved)
