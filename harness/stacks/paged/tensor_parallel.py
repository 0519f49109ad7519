"""Tensor parallelism for the paged stack: Megatron-style sharding of the dense decoder over the ranks of
the default torch.distributed group (one process per rank, started by harness.rank_workers).

  embed_tokens  vocab-parallel: each rank holds vocab/N rows, looks up its own ids, all-reduce (sum)
  q/k/v_proj    column-parallel: each rank holds heads/N query heads and kv_heads/N KV heads
  o_proj        row-parallel: the rank's heads' columns, all-reduce (sum) of the partial outputs
  gate/up_proj  column-parallel: intermediate/N rows each
  down_proj     row-parallel: intermediate/N columns, all-reduce
  lm_head       vocab-parallel: vocab/N rows; the sampled rows' logits are all-gathered (a [rows, vocab]
                float32 buffer per rank), so every rank samples the same token
  norms, rotary replicated

Each rank's KV pool holds its KV heads only (the rank-local ModelSpec has kv_heads/N), so kv.* metrics are
per rank. Every rank builds the full seeded model (the same weights as at tensor_parallel 1) and keeps its
slices: the full weights are held once, transiently, while the model is built. MLA and MoE layers are not
sharded: check() refuses them at tensor_parallel > 1.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...devices import is_cuda
from ...errors import StackUnavailable
from .config import ModelSpec
from .model import CausalLM


def check(workload, spec: ModelSpec, device) -> None:
    """Raise StackUnavailable if the workload's model cannot be sharded over its tensor_parallel ranks."""
    n = workload.tensor_parallel
    if is_cuda(device) and torch.cuda.device_count() < n:
        raise StackUnavailable(f"tensor_parallel {n} needs {n} GPUs (one per rank); this runner has "
                               f"{torch.cuda.device_count()}")
    if spec.mla or spec.n_routed_experts:
        kind = " and ".join(k for k, on in (("MLA", spec.mla), ("MoE", spec.n_routed_experts)) if on)
        raise StackUnavailable(f"the paged stack shards dense decoders only (GQA/MHA attention, gated MLP); "
                               f"{workload.preset.name}'s {kind} layers do not run at tensor_parallel {n} yet")
    if any(r.images for r in workload.requests):
        raise StackUnavailable(f"image requests do not run at tensor_parallel {n} in the paged stack")
    for what, size in (("num_attention_heads", spec.heads), ("num_key_value_heads", spec.kv_heads),
                       ("intermediate_size", spec.intermediate), ("vocab_size", spec.vocab)):
        if size % n:
            raise StackUnavailable(f"{what} ({size}) is not divisible by tensor_parallel ({n})")


class RowParallelLinear(nn.Module):
    """y = all_reduce(x @ W_shard^T) + b: the input's last dim is this rank's shard."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        dist.all_reduce(y)
        if self.bias is not None:
            y += self.bias
        return y


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor, start: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start, self.end = start, start + weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        h = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        h.masked_fill_(outside[:, None], 0)
        dist.all_reduce(h)
        return h


class ParallelCausalLM(CausalLM):
    """CausalLM whose lm_head holds this rank's vocabulary rows: logits are all-gathered."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(self.model.norm(hidden), self.lm_head.weight).float()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=-1)


def _rows(t: torch.Tensor | None, rank: int, n: int) -> torch.Tensor | None:
    return None if t is None else t.chunk(n, dim=0)[rank].clone()


def _cols(t: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    return t.chunk(n, dim=-1)[rank].contiguous()


def shard(model: CausalLM, spec: ModelSpec) -> ModelSpec:
    """Keep this rank's slices of every tensor (the full ones are dropped with the transformers model) and
    return the rank-local spec (heads, kv_heads, intermediate divided by the world size; vocab whole)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            proj.weight = nn.Parameter(_rows(proj.weight.data, rank, n), requires_grad=False)
            if proj.bias is not None:
                proj.bias = nn.Parameter(_rows(proj.bias.data, rank, n), requires_grad=False)
        attn.heads, attn.kv_heads = spec.heads // n, spec.kv_heads // n
        attn.o_proj = RowParallelLinear(_cols(attn.o_proj.weight.data, rank, n), _bias(attn.o_proj))
        mlp.down_proj = RowParallelLinear(_cols(mlp.down_proj.weight.data, rank, n), _bias(mlp.down_proj))
    embed = model.model.embed_tokens.weight.data
    model.model.embed_tokens = VocabParallelEmbedding(_rows(embed, rank, n), rank * (spec.vocab // n))
    model.lm_head.weight = nn.Parameter(_rows(model.lm_head.weight.data, rank, n), requires_grad=False)
    model.__class__ = ParallelCausalLM
    return dataclasses.replace(spec, heads=spec.heads // n, kv_heads=spec.kv_heads // n,
                               intermediate=spec.intermediate // n)


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.data.clone()


def outputs_note(outputs: list[list[int]]) -> str:
    """A note naming the greedy tokens (sha256 of the outputs, the same on every rank: each samples from the
    all-gathered logits), for comparing a tensor-parallel run with tensor_parallel 1."""
    return f"greedy outputs sha256 {outputs_digest(outputs)} (rank {dist.get_rank()} of {dist.get_world_size()})"


def outputs_digest(outputs: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]
