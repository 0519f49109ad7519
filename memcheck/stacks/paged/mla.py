"""Multi-head latent attention (DeepSeek-V2/V3) over a paged cache that holds only the latent: one
(kv_lora_rank + qk_rope_head_dim)-wide row per token (576 for the published models), shared by all heads.

Decode rows run absorbed (kernels.mla_decode): W_UK (from kv_b_proj) folds into the query, attention runs in latent
space straight over the cache, reading each cached row once for all heads, and W_UV maps the latent output back to
per-head values. Prefill rows are compute-bound: they run decompressed (kernels.mla_mha_prefill), each sequence's
latent through kv_b_proj into per-head keys and values, then attention with 192-wide scores, a third of the absorbed
form's FLOPs per (query, key) pair at DeepSeek's widths, as vLLM's MLA prefill does (the kernel holds a bounded window
of the context decompressed at a time). Decompressing costs FLOPs per context token, though: a step of few new tokens
over a long cached prefix runs its prefill absorbed (kernels.mla_prefill) where that costs less (runs_decompressed)."""
from __future__ import annotations

import torch
from torch import nn

from memcheck import kernels

from .config import ModelSpec
from .context import StepContext
from .layers import Linear, RMSNorm, Rotary, fused_linear

# Per FLOP, the absorbed prefill kernel runs 1.8x slower than the decompressed one (H200, benchmarks/kernels_h200.py,
# 16 heads x 4K: 292 GFLOP in 1.68 ms against 103 GFLOP, the decompression included, in 0.325 ms).
ABSORBED_SLOWDOWN = 1.8


def runs_decompressed(ctx: StepContext, rank: int, nope: int, rope: int, v_dim: int) -> bool:
    """Whether a step's prefill rows run decompressed: its FLOPs (kv_b_proj over every context token, then attention
    with (nope + rope)-wide scores and v-wide values) at most the absorbed form's ((rank + rope)-wide scores, rank-wide
    values), weighed by ABSORBED_SLOWDOWN. Per head, in multiply-adds."""
    decompressed = ctx.prefill_context_tokens * rank * (nope + v_dim) + ctx.prefill_pairs * (nope + rope + v_dim)
    return decompressed <= ABSORBED_SLOWDOWN * ctx.prefill_pairs * (2 * rank + rope)


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
        t, h, nd = x.shape[0], self.heads, ctx.num_decode
        q, kv = self._project(x)
        q_nope, q_pe = q.view(t, h, -1).split([self.nope, self.rope], dim=-1)
        norm = self.kv_a_layernorm  # the latent normalised and rotated into the cache, the query rotated: one launch
        q_pe = kernels.write_latent(kv, norm.weight, norm.eps, ctx.cos, ctx.sin, self.rotary.interleaved,
                                    self.latent_cache, ctx.slot_mapping, q_pe=q_pe)
        del kv
        o = x.new_empty(t, h * self.v_dim)  # o_proj's input: every path writes its rows in place
        if ctx.mla_prefill_absorbed is None:
            decompressed = runs_decompressed(ctx, self.rank, self.nope, self.rope, self.v_dim)
        else:
            decompressed = not ctx.mla_prefill_absorbed
        absorbed = nd if decompressed else t  # the first rows run absorbed: decode, and prefill where it costs less
        if absorbed:
            self._absorbed(q_nope[:absorbed], q_pe[:absorbed], ctx, o[:absorbed])
        if absorbed < t:
            kernels.mla_mha_prefill(q_nope[nd:], q_pe[nd:], self.latent_cache, ctx.prefill_block_table,
                                    ctx.cu_seqlens_q, ctx.prefill_seq_lens, self.kv_b_proj.weight, self.scale,
                                    ctx.max_q_len, ctx.prefill_context_tokens, out=o[nd:].view(t - nd, h, self.v_dim))
        del q, q_nope, q_pe
        return self.o_proj(o)

    def _absorbed(self, q_nope, q_pe, ctx: StepContext, o: torch.Tensor) -> None:
        """o [rows, heads x v] <- absorbed attention of the first rows: the decode rows, then (when the step's prefill
        runs absorbed) the prefill rows."""
        rows, h, nd = q_nope.shape[0], self.heads, ctx.num_decode
        w = self.kv_b_proj.weight.view(h, self.nope + self.v_dim, self.rank)
        q_latent = torch.bmm(q_nope.transpose(0, 1), w[:, :self.nope]).transpose(0, 1)  # [rows, h, rank]
        out = torch.empty_like(q_latent)
        if nd:
            kernels.mla_decode(q_latent[:nd], q_pe[:nd], self.latent_cache, ctx.decode_block_table,
                               ctx.decode_seq_lens, self.scale, out=out[:nd])
        if nd < rows:
            kernels.mla_prefill(q_latent[nd:], q_pe[nd:], self.latent_cache, ctx.prefill_block_table,
                                ctx.cu_seqlens_q, ctx.prefill_seq_lens, self.scale, ctx.max_q_len, out=out[nd:])
        del q_latent
        w_uv = w[:, self.nope:].transpose(1, 2)  # each head's columns of o_proj's input written in place (cuBLAS
        torch.bmm(out.transpose(0, 1), w_uv, out=o.view(rows, h, self.v_dim).transpose(0, 1))  # makes no copy)
