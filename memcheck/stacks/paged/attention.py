"""Grouped-query (and plain multi-head) attention over the paged K/V cache: Llama, Qwen2 (q/k/v bias),
DeepSeek-VL's language model. New tokens' K/V are written to their slots first; decode rows then go
to kernels.paged_decode, prefill chunks to kernels.paged_prefill (Triton on CUDA, torch references
on the CPU)."""
from __future__ import annotations

import torch
from torch import nn

from memcheck import kernels

from .config import ModelSpec
from .context import StepContext
from .layers import Linear, Rotary, fused_linear


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: Rotary, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.q_proj = Linear(spec.hidden, spec.heads * spec.head_dim, bias=bias)
        self.k_proj = Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=bias)
        self.v_proj = Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=bias)
        self.o_proj = Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)
        self.rotary = rotary
        self.scale = spec.head_dim ** -0.5
        self.k_cache = self.v_cache = None  # [num_blocks, block_size, kv_heads, head_dim], set by KVPool
        self.qkv_proj = None  # after fuse(): one [q; k; v] projection

    def fuse(self) -> None:
        self.qkv_proj = fused_linear(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        t = x.shape[0]
        if self.qkv_proj is not None:  # q and k rotated, k and v written to the caches: one launch on CUDA
            q = kernels.rotate_and_write_kv(self.qkv_proj(x), self.heads, self.kv_heads, ctx.cos, ctx.sin,
                                            self.rotary.interleaved, self.k_cache, self.v_cache, ctx.slot_mapping)
        else:
            q = self.rotary.apply(self.q_proj(x).view(t, self.heads, self.head_dim), ctx.cos, ctx.sin)
            k = self.rotary.apply(self.k_proj(x).view(t, self.kv_heads, self.head_dim), ctx.cos, ctx.sin)
            kernels.write_kv(k, self.v_proj(x).view(t, self.kv_heads, self.head_dim), self.k_cache, self.v_cache,
                             ctx.slot_mapping)
            del k
        nd = ctx.num_decode
        if nd == t:
            out = self._decode(q, ctx)
        elif nd == 0:
            out = self._prefill(q, ctx)
        else:
            out = torch.empty_like(q)
            out[:nd] = self._decode(q[:nd], ctx)
            out[nd:] = self._prefill(q[nd:], ctx)
        del q
        return self.o_proj(out.view(t, self.heads * self.head_dim))

    def _decode(self, q, ctx):
        return kernels.paged_decode(q, self.k_cache, self.v_cache, ctx.decode_block_table, ctx.decode_seq_lens,
                                    self.scale)

    def _prefill(self, q, ctx):
        return kernels.paged_prefill(q, self.k_cache, self.v_cache, ctx.prefill_block_table, ctx.cu_seqlens_q,
                                     ctx.prefill_seq_lens, self.scale, max_q_len=ctx.max_q_len)
