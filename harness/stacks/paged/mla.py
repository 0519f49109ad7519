"""Multi-head latent attention (DeepSeek-V2/V3) over a paged cache that holds only the latent: one
(kv_lora_rank + qk_rope_head_dim)-wide row per token (576 for the published models), shared by all heads.

Projections are absorbed: W_UK (from kv_b_proj) folds into the query, so attention runs in latent
space straight over the cache, and W_UV maps the latent output back to per-head values. Decode rows
go to kernels.mla_decode, the prefill chunks of every sequence to kernels.mla_prefill (one launch)."""
from __future__ import annotations

import torch
from torch import nn

import kernels

from .config import ModelSpec
from .context import StepContext
from .layers import Linear, RMSNorm, Rotary, fused_linear


class MLAttention(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: Rotary):
        super().__init__()
        self.heads, self.rank, self.rope = spec.heads, spec.kv_lora_rank, spec.qk_rope_head_dim
        self.nope, self.v_dim = spec.qk_nope_head_dim, spec.v_head_dim
        qk = self.nope + self.rope
        if spec.q_lora_rank:
            self.q_a_proj = Linear(spec.hidden, spec.q_lora_rank, bias=spec.o_bias)
            self.q_a_layernorm = RMSNorm(spec.q_lora_rank, 1e-6)
            self.q_b_proj = Linear(spec.q_lora_rank, spec.heads * qk, bias=False)
        else:
            self.q_proj = Linear(spec.hidden, spec.heads * qk, bias=False)
        self.kv_a_proj_with_mqa = Linear(spec.hidden, self.rank + self.rope, bias=spec.o_bias)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6)
        self.kv_b_proj = Linear(self.rank, spec.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = Linear(spec.heads * self.v_dim, spec.hidden, bias=spec.o_bias)
        self.rotary = rotary
        self.scale = qk ** -0.5  # the loader sets the transformers module's (yarn mscale included)
        self.latent_cache = None  # [num_blocks, block_size, rank + rope], set by KVPool
        self.q_kv_a_proj = None  # after fuse(): the query's first projection and kv_a_proj_with_mqa as one

    def fuse(self) -> None:
        """q_proj (or q_a_proj, with a query LoRA) and kv_a_proj_with_mqa read the same x: one product."""
        first = self.q_proj if hasattr(self, "q_proj") else self.q_a_proj
        if (first.bias is None) != (self.kv_a_proj_with_mqa.bias is None):
            return
        self.q_width = first.weight.shape[0]  # (a tensor-parallel shard keeps nn.Linear's full out_features)
        self.q_kv_a_proj = fused_linear(first, self.kv_a_proj_with_mqa)
        del self.kv_a_proj_with_mqa
        if hasattr(self, "q_proj"):
            del self.q_proj
        else:
            del self.q_a_proj

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q [t, heads x (nope + rope)], the latent's projection [t, rank + rope])."""
        if self.q_kv_a_proj is not None:
            q, kv = self.q_kv_a_proj(x).split([self.q_width, self.rank + self.rope], dim=-1)
        else:
            q = self.q_proj(x) if hasattr(self, "q_proj") else self.q_a_proj(x)
            kv = self.kv_a_proj_with_mqa(x)
        if hasattr(self, "q_b_proj"):
            q = self.q_b_proj(self.q_a_layernorm(q))
        return q, kv

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        t, h = x.shape[0], self.heads
        q, kv = self._project(x)
        q_nope, q_pe = q.view(t, h, -1).split([self.nope, self.rope], dim=-1)
        norm = self.kv_a_layernorm  # the latent normalised and rotated into the cache, the query rotated: one launch
        q_pe = kernels.write_latent(kv, norm.weight, norm.eps, ctx.cos, ctx.sin, self.rotary.interleaved,
                                    self.latent_cache, ctx.slot_mapping, q_pe=q_pe)
        w = self.kv_b_proj.weight.view(h, self.nope + self.v_dim, self.rank)
        q_latent = torch.bmm(q_nope.transpose(0, 1), w[:, :self.nope]).transpose(0, 1)  # [t, h, rank]
        del q, q_nope, kv  # views of the fused projection's output: it goes now, not after attention
        out = torch.empty_like(q_latent)
        nd = ctx.num_decode
        if nd:
            kernels.mla_decode(q_latent[:nd], q_pe[:nd], self.latent_cache, ctx.decode_block_table,
                               ctx.decode_seq_lens, self.scale, out=out[:nd])
        if nd < t:
            kernels.mla_prefill(q_latent[nd:], q_pe[nd:], self.latent_cache, ctx.prefill_block_table,
                                ctx.cu_seqlens_q, ctx.prefill_seq_lens, self.scale, ctx.max_q_len, out=out[nd:])
        del q_latent, q_pe
        w_uv = w[:, self.nope:].transpose(1, 2)
        if out.is_cuda:  # cuBLAS writes each head's columns of o_proj's input in place (no transposing copy)
            o = out.new_empty(t, h * self.v_dim)
            torch.bmm(out.transpose(0, 1), w_uv, out=o.view(t, h, self.v_dim).transpose(0, 1))
        else:  # (the CPU's BLAS would copy through a temporary: the CPU baselines keep today's allocations)
            o = torch.bmm(out.transpose(0, 1), w_uv).transpose(0, 1).reshape(t, h * self.v_dim)
        return self.o_proj(o)
