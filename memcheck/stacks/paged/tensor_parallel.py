"""Tensor parallelism for the paged stack: Megatron-style sharding of the decoder over the ranks of the default
torch.distributed group (one process per rank, started by memcheck.rank_workers).

  embed_tokens  vocab-parallel: each rank holds vocab/N rows, looks up its own ids, all-reduce (sum)
  q/k/v_proj    column-parallel: each rank holds heads/N query heads and kv_heads/N KV heads
  o_proj        row-parallel: the rank's heads' columns, all-reduce (sum) of the partial outputs
  gate/up_proj  column-parallel: intermediate/N rows each
  down_proj     row-parallel: intermediate/N columns, all-reduce
  lm_head       vocab-parallel: vocab/N rows; the sampled rows' logits are all-gathered (a [rows, vocab]
                float32 buffer per rank), so every rank samples the same token
  MLA           q_proj (or q_b_proj) and kv_b_proj column-parallel by heads (heads/N each), o_proj
                row-parallel; q_a_proj, q_a_layernorm, kv_a_proj_with_mqa and kv_a_layernorm whole on every
                rank, so each rank writes the whole latent: the latent cache is replicated, as serving engines
                do (vLLM, SGLang), and kv.* per rank is the full latent cache
  MoE           every routed expert's intermediate dimension split N ways (gate_up rows of each half, down
                columns), so the experts' weights shard across ranks and kernels.fused_moe runs unchanged on
                the rank's slices; shared experts split as the dense MLP; the layer's sum all-reduced once.
                The router is whole: every rank routes the same (all-reduced) hidden states to the same experts
  replicated    norms, the router, MLA's latent projections, biases of row-parallel layers (counted in each
                rank's weights; a note names them and their bytes); the rotary frequencies (a buffer)

Expert parallelism (E/N whole experts per rank) was not chosen: under skewed routing (every token picking the
same experts) one rank would do all the expert work and hold all the picks' activations.

Each rank builds its shard only: the transformers model is built with its parameters on the meta device while
seeded_weights records their seeded init, and the rank's slices are drawn on its device one tensor at a time,
with tensor_parallel 1's values; the largest (embeddings, lm_head) first, while the rank holds least. Dense
layers' KV pool holds the rank's KV heads only (the rank-local ModelSpec has kv_heads/N).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from memcheck import kernels

from ... import transformers_compat as compat
from ...devices import is_cuda
from ...errors import SoftwareUnsupported, StackUnavailable
from .config import ModelSpec
from .layers import GatedMLP
from .mla import MLAttention
from .model import CausalLM
from .moe import MoE
from .seeded_weights import SeededWeights


def check(workload, spec: ModelSpec, device) -> None:
    """Raise StackUnavailable if the workload's model cannot be sharded over its tensor_parallel ranks."""
    n = workload.tensor_parallel
    if is_cuda(device) and torch.cuda.device_count() < n:
        raise StackUnavailable(f"tensor_parallel {n} needs {n} GPUs (one per rank); this runner has "
                               f"{torch.cuda.device_count()}")
    if any(r.images for r in workload.requests):
        raise StackUnavailable(f"image requests do not run at tensor_parallel {n} in the paged stack")
    if importlib.util.find_spec("transformers.initialization") is None:  # what seeded_weights.py records through
        raise SoftwareUnsupported(f"tensor_parallel {n} in the paged stack draws each rank's seeded weights through "
                                  f"transformers.initialization (transformers 5.0 and newer); transformers "
                                  f"{compat.version()} has none")
    sizes = [("num_attention_heads", spec.heads), ("vocab_size", spec.vocab)]
    if not spec.mla:
        sizes.append(("num_key_value_heads", spec.kv_heads))
    if any(not spec.is_moe_layer(i) for i in range(spec.layers)):
        sizes.append(("intermediate_size", spec.intermediate))
    if spec.n_routed_experts:
        sizes.append(("moe_intermediate_size", spec.moe_intermediate))
    for what, size in sizes:
        if size % n:
            raise StackUnavailable(f"{what} ({size}) is not divisible by tensor_parallel ({n})")


class RowParallelLinear(nn.Module):
    """y = all_reduce(x @ W_shard^T) + b: the input's last dim is this rank's shard."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = kernels.linear(x, self.weight)
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
        local = self.lm_head(self.model.norm(hidden)).float()
        n, (tokens, shard) = dist.get_world_size(), local.shape
        parts = local.new_empty(n * tokens, shard)  # one collective into one tensor (captured in the decode graphs)
        dist.all_gather_into_tensor(parts, local)
        return parts.view(n, tokens, shard).transpose(0, 1).reshape(tokens, n * shard)


class ParallelMoE(MoE):
    """MoE over this rank's slice of every expert and of the shared experts: the ranks' partial sums add up to
    the layer's output (one all-reduce). The router is whole, so every rank picks the same experts."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


class Cutter:
    """Draws this rank's slices (seeded_weights.materialise) and counts what every rank holds whole."""

    def __init__(self, weights: SeededWeights, rank: int, n: int):
        self.weights, self.rank, self.n = weights, rank, n
        self.replicated_bytes, self.replicated_names = 0, set()

    def rows(self, t: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
        """The rank's 1/N of t along dim (contiguous blocks: rank 0 the first)."""
        return None if t is None else self.weights.materialise(t, lambda full: full.chunk(self.n, dim)[self.rank])

    def cols(self, t: torch.Tensor) -> torch.Tensor:
        return self.rows(t, -1)

    def halves(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """[gate; up] along dim: the rank's 1/N of each half, side by side (a fused gate/up projection)."""
        return self.weights.materialise(
            t, lambda full: torch.cat([h.chunk(self.n, dim)[self.rank] for h in full.chunk(2, dim)], dim))

    def whole(self, t: torch.Tensor | None, name: str) -> torch.Tensor | None:
        if t is None:
            return None
        full = self.weights.materialise(t)
        self.replicated_bytes += full.numel() * full.element_size()
        self.replicated_names.add(re.sub(r"\.\d+\.", ".*.", name))
        return full

    def the_rest_whole(self, model: nn.Module) -> None:
        """Every parameter and buffer still on the meta device (norms, router, MLA's latent projections...),
        drawn whole on every rank."""
        drawn = {}
        for prefix, module in model.named_modules():
            for table in (module._parameters, module._buffers):
                for name, t in table.items():
                    if t is None or not t.is_meta:
                        continue
                    if id(t) not in drawn:
                        drawn[id(t)] = self.whole(t, f"{prefix}.{name}")
                    full = drawn[id(t)]
                    table[name] = nn.Parameter(full, requires_grad=False) if table is module._parameters else full

    def note(self) -> str:
        return (f"replicated on every rank ({self.replicated_bytes} bytes, counted in each rank's weights): "
                + ", ".join(sorted(self.replicated_names)))


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


def _column(linear: nn.Linear, cut: Cutter) -> None:
    linear.weight, linear.bias = _param(cut.rows(linear.weight)), _param(cut.rows(linear.bias))


def _row(linear: nn.Linear, cut: Cutter, name: str) -> RowParallelLinear:
    return RowParallelLinear(cut.cols(linear.weight), cut.whole(linear.bias, name))


def _shard_mlp(mlp: GatedMLP, cut: Cutter, name: str, reduce: bool) -> None:
    """Column-parallel gate/up, row-parallel down; reduce=False leaves the all-reduce to the caller (an MoE
    layer sums its experts first), the down bias then on rank 0 only so the sum counts it once."""
    _column(mlp.gate_proj, cut)
    _column(mlp.up_proj, cut)
    if reduce:
        mlp.down_proj = _row(mlp.down_proj, cut, f"{name}.down_proj.bias")
        return
    down = mlp.down_proj
    bias = cut.whole(down.bias, f"{name}.down_proj.bias")
    if bias is not None and cut.rank:
        bias.zero_()
    down.weight, down.bias = _param(cut.cols(down.weight)), _param(bias)


def _shard_moe(moe: MoE, cut: Cutter, name: str) -> None:
    experts = moe.experts
    experts.gate_up_proj = _param(cut.halves(experts.gate_up_proj, dim=1))  # [E, 2 x inter/N, hidden]
    experts.down_proj = _param(cut.rows(experts.down_proj, dim=-1))  # [E, hidden, inter/N]
    if moe.shared_experts is not None:
        _shard_mlp(moe.shared_experts, cut, f"{name}.shared_experts", reduce=False)
    moe.__class__ = ParallelMoE


def _shard_attention(attn: nn.Module, cut: Cutter, name: str) -> None:
    if isinstance(attn, MLAttention):  # by heads; the latent projections stay whole (the_rest_whole)
        _column(attn.q_proj if hasattr(attn, "q_proj") else attn.q_b_proj, cut)
        _column(attn.kv_b_proj, cut)
    else:
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            _column(proj, cut)
        attn.kv_heads //= cut.n
    attn.heads //= cut.n
    attn.o_proj = _row(attn.o_proj, cut, f"{name}.o_proj.bias")


def shard(model: CausalLM, spec: ModelSpec, weights: SeededWeights, rank: int | None = None,
          n: int | None = None) -> tuple[ModelSpec, str]:
    """Draw this rank's slices of a model whose parameters are on the meta device (CausalLM.from_hf over
    build_hf_model(..., weights=weights)); the rest whole. Returns the rank-local spec (heads, kv_heads,
    intermediate and moe_intermediate divided by the world size; vocab whole) and a note naming what is
    replicated. rank, n: the group's by default."""
    rank = dist.get_rank() if rank is None else rank
    n = dist.get_world_size() if n is None else n
    cut = Cutter(weights, rank, n)
    # the largest tensors first, while this rank holds least
    model.model.embed_tokens = VocabParallelEmbedding(cut.rows(model.model.embed_tokens.weight),
                                                      rank * (spec.vocab // n))
    model.lm_head.weight = _param(cut.rows(model.lm_head.weight))
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}"
        _shard_attention(layer.self_attn, cut, f"{prefix}.self_attn")
        if isinstance(layer.mlp, MoE):
            _shard_moe(layer.mlp, cut, f"{prefix}.mlp")
        else:
            _shard_mlp(layer.mlp, cut, f"{prefix}.mlp", reduce=True)
    cut.the_rest_whole(model)
    model.__class__ = ParallelCausalLM
    local = dataclasses.replace(spec, heads=spec.heads // n,
                                kv_heads=spec.kv_heads if spec.mla else spec.kv_heads // n,
                                intermediate=spec.intermediate // n, moe_intermediate=spec.moe_intermediate // n)
    return local, cut.note()


def outputs_note(outputs: list[list[int]]) -> str:
    """A note naming the greedy tokens (sha256 of the outputs, the same on every rank: each samples from the
    all-gathered logits), for comparing a tensor-parallel run with tensor_parallel 1."""
    return f"greedy outputs sha256 {outputs_digest(outputs)} (rank {dist.get_rank()} of {dist.get_world_size()})"


def outputs_digest(outputs: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]
