"""The activation workspace the engine declares: an upper bound on the bytes a forward pass holds
beyond the weights and the KV pool, sized from the token budget (max_num_batched_tokens).

Counted per token at the widest point of a layer (the residual stream the caller still holds, plus
the phase's live intermediates), times the budget; plus the logits of the sampled rows; on CUDA the decode
kernels' partial results and the cuBLAS workspace the torch allocator hands out (and, once captured, the decode
CUDA graphs' memory pool, which the stack adds as measured at capture: graphs.py); on the CPU the scratch of
the torch reference kernels (one sequence's scores and gathered K/V, which the Triton kernels never
materialise). The harness reports it beside the floors (weights, KV): a stack whose peak above the weights
exceeds KV + workspace by much has a transient nobody declared."""
from __future__ import annotations

from dataclasses import dataclass, field

from memcheck.kernels.dispatch import MAX_PROGRAMS_PER_SM

from .config import EngineConfig, ModelSpec, input_tokens

# The decode kernels split their work over a one-wave grid (memcheck/kernels/work_split.py): at most multiprocessors x
# MAX_PROGRAMS_PER_SM programs, each with 2 partial slots of its rows (a KV head's query group, or a block of
# MLA heads: memcheck/kernels/mla.py's head_block) x (width + 1) float32, whatever the batch.
MLA_HEAD_BLOCK = 16
CUBLAS_WORKSPACE = 36 << 20  # cuBLAS (32 MiB on Hopper) + cuBLASLt workspaces, from the caching allocator


@dataclass
class Workspace:
    budget_tokens: int
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.parts.items() if v)
        return (f"declared activation workspace: {self.total} bytes ({self.total / 2**20:.1f} MiB) for a budget of "
                f"{self.budget_tokens} tokens per forward pass: {parts}")


def per_token_bytes(spec: ModelSpec, dtype_bytes: int, shared_as_experts: bool = False) -> int:
    """Widest point of any layer, per token in the batch. shared_as_experts: the Triton MoE kernels run the
    shared experts as more picks of every token (memcheck/kernels/moe.py), in the routed buffers."""
    e, h = dtype_bytes, spec.hidden
    residual = 2 * h * e  # the layer's input (still held by the caller) and the new residual
    norm = 2 * h * 4 + h * e  # float32 copy and its scaled copy, then the cast result
    if spec.mla:
        r, p, heads = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.heads
        q = heads * (spec.qk_nope_head_dim + p) * e + max(spec.q_lora_rank, 0) * e * 2
        rope = 4 * heads * p * 4  # float32 halves and products of the rotated query part
        latent = 3 * (r + p) * e  # projection, normed latent, concatenated row
        attn = h * e + q + rope + latent + 2 * heads * r * e + 2 * heads * spec.v_head_dim * e + h * e
    else:
        q, kv = spec.heads * spec.head_dim * e, spec.kv_heads * spec.head_dim * e
        attn = h * e + 4 * q + 6 * kv + q + h * e  # normed input, q/k/v and their rotation, output, o_proj
    mlp = h * e + 2 * spec.intermediate * e + h * e  # normed input, gate (activated in place), up, down
    if spec.n_routed_experts:
        k, i = spec.top_k + (spec.n_shared_experts if shared_as_experts else 0), spec.moe_intermediate
        routed = k * (2 * h * e + 3 * i * e + h * 4)  # worst case: one expert takes every pick of the batch
        router = 3 * spec.n_routed_experts * 4 + h * 4
        shared = 2 * i * spec.n_shared_experts * e + h * e
        mlp = max(mlp, h * e + h * e + router + max(routed, shared) + h * e)
    return residual + max(norm, attn, mlp)


def declare(spec: ModelSpec, cfg: EngineConfig, requests, dtype_bytes: int, multiprocessors: int | None,
            image_tokens: int = 0) -> Workspace:
    """multiprocessors: the GPU's (None on the CPU, where the torch reference kernels run)."""
    budget = cfg.max_num_batched_tokens
    inputs = [input_tokens(r, image_tokens) for r in requests]
    longest = max(n + r.max_new_tokens for n, r in zip(inputs, requests))
    seqs = min(cfg.max_num_seqs, len(requests), budget)
    ws = Workspace(budget)
    layer = per_token_bytes(spec, dtype_bytes, shared_as_experts=bool(multiprocessors))
    ws.parts["layer activations"] = budget * layer
    ws.parts["logits"] = seqs * (spec.vocab * (dtype_bytes + 4) + spec.hidden * dtype_bytes * 2)
    if multiprocessors:
        width = spec.kv_lora_rank if spec.mla else spec.head_dim
        rows = MLA_HEAD_BLOCK if spec.mla else spec.heads // spec.kv_heads
        ws.parts["decode partials"] = multiprocessors * MAX_PROGRAMS_PER_SM * 2 * rows * (width + 1) * 4
        ws.parts["cuBLAS workspace"] = CUBLAS_WORKSPACE
    else:  # the torch reference kernels materialise one sequence's scores and its gathered K/V (or latent)
        chunk = min(budget, max(inputs))
        row = spec.latent_width if spec.mla else 2 * spec.kv_heads * spec.head_dim
        ws.parts["reference attention scratch"] = 3 * 4 * (chunk * spec.heads * longest + longest * row)
    return ws
