"""Paged attention for memcheck's `paged` stack: Triton kernels over a paged KV cache, each with a torch
reference (kernels.reference). The block manager that hands out the blocks is the engine's
(memcheck/stacks/paged/block_manager.py).

Cache layouts: K and V [num_blocks, block_size, num_kv_heads, head_dim], one tensor each;
MLA latent [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim].

Every entry point dispatches on its inputs: CUDA tensors run the Triton kernel; CPU tensors run it
under Triton's interpreter when TRITON_INTERPRET=1, and the torch reference otherwise.
Importing this package is cheap: torch and triton load on the first call.
(No __version__ here: transformers probes a top-level `kernels`, Hugging Face's package name.)
"""
from .dispatch import use_triton

__all__ = ["preload", "paged_decode", "paged_prefill", "mla_decode", "mla_prefill", "mla_mha_prefill", "write_kv",
           "write_latent", "route", "fused_moe", "rms_norm", "apply_rotary", "silu_mul_", "linear",
           "rotate_and_write_kv"]


TRITON_MODULES = ("decode", "prefill", "mla", "mla_mha", "cache_write", "router", "moe", "norm", "rotary",
                  "activation", "skinny_gemm")


def preload(device) -> None:
    """Import now the implementations `device` runs, not at their first call inside a measured run: an import there
    compiles its module under tracemalloc (where no .pyc is written), which host.heap_alloc.peak would count."""
    import importlib

    from .dispatch import triton_runs_on

    for name in TRITON_MODULES if triton_runs_on(device) else ("reference",):
        importlib.import_module(f"{__name__}.{name}")


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale):
    """Attention of one new token per sequence over its paged K/V.
    q [num_seqs, num_q_heads, head_dim]; k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim];
    block_table [num_seqs, max_blocks] int32; seq_lens [num_seqs] int32 (tokens in the cache,
    the new one included). Returns out shaped and typed like q."""
    if use_triton(q):
        from .decode import paged_decode as impl
    else:
        from .reference import paged_decode as impl
    return impl(q, k_cache, v_cache, block_table, seq_lens, scale)


def paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, max_q_len=None):
    """Prefill and chunked prefill, variable lengths in one launch. q [total_new_tokens, num_q_heads,
    head_dim] packs each sequence's new tokens (rows cu_seqlens_q[i]:cu_seqlens_q[i+1]), whose K/V are
    already written to the cache; seq_lens counts cached + new tokens. Causal within the new tokens,
    full attention to the cached prefix. max_q_len (a host int) saves a device sync."""
    if use_triton(q):
        from .prefill import paged_prefill as impl

        return impl(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, max_q_len=max_q_len)
    from .reference import paged_prefill as impl

    return impl(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale)


def mla_decode(q_latent, q_pe, latent_cache, block_table, seq_lens, scale, out=None):
    """Multi-head latent attention decode with absorbed projections. q_latent [num_seqs, num_heads,
    kv_lora_rank] (q_nope @ W_UK), q_pe [num_seqs, num_heads, qk_rope_head_dim], latent_cache
    [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]. Returns [num_seqs, num_heads,
    kv_lora_rank] in latent space (into `out` where given); the caller applies W_UV."""
    if use_triton(q_latent):
        from .mla import mla_decode as impl

        return impl(q_latent, q_pe, latent_cache, block_table, seq_lens, scale, out=out)
    from .reference import mla_decode as impl

    result = impl(q_latent, q_pe, latent_cache, block_table, seq_lens, scale)
    return result if out is None else out.copy_(result)


def mla_prefill(q_latent, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, scale, max_q_len=None, out=None):
    """MLA prefill (absorbed, latent space) of packed new tokens over the paged latent cache:
    out [T, H, R] (the caller applies W_UV)."""
    if use_triton(q_latent):
        from .mla import mla_prefill as impl

        return impl(q_latent, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, scale, max_q_len, out=out)
    from .reference import mla_prefill as impl

    result = impl(q_latent, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, scale)
    return result if out is None else out.copy_(result)


def mla_mha_prefill(q_nope, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, kv_b_weight, scale,
                    max_q_len=None, context_tokens=None, out=None):
    """MLA prefill decompressed: the context's latent through kv_b_proj (kv_b_weight [H * (nope + v), rank]) into
    per-head keys and values, then attention with 192-wide scores. q_nope [T, H, nope], q_pe [T, H, rope];
    out [T, H, v] in value space (the caller applies o_proj, not W_UV). context_tokens: the sum of seq_lens, where
    the caller knows it (no host sync)."""
    if use_triton(q_nope):
        from .mla_mha import mla_mha_prefill as impl

        return impl(q_nope, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, kv_b_weight, scale, max_q_len,
                    context_tokens, out=out)
    from .reference import mla_mha_prefill as impl

    result = impl(q_nope, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, kv_b_weight, scale)
    return result if out is None else out.copy_(result)


def write_kv(key, value, k_cache, v_cache, slot_mapping):
    """k_cache/v_cache at slot_mapping[t] (= block * block_size + offset) <- key/value [t]
    ([num_tokens, num_kv_heads, head_dim]); slots < 0 are skipped (padding)."""
    if use_triton(key):
        from .cache_write import write_kv as impl
    else:
        from .reference import write_kv as impl
    impl(key, value, k_cache, v_cache, slot_mapping)


def rotate_and_write_kv(qkv, heads, kv_heads, cos, sin, interleaved, k_cache, v_cache, slot_mapping):
    """From the fused projection's rows qkv [T, (heads + 2 x kv_heads) x head_dim]: returns the query rotated
    [T, heads, head_dim]; writes the key rotated and the value at slot_mapping (as write_kv; cos/sin as for
    apply_rotary). One launch on CUDA (three as rotary, rotary, write_kv)."""
    if use_triton(qkv):
        from .cache_write import rotate_and_write_kv as impl
    else:
        from .reference import rotate_and_write_kv as impl
    return impl(qkv, heads, kv_heads, cos, sin, interleaved, k_cache, v_cache, slot_mapping)


def write_latent(kv_a, norm_weight, eps, cos, sin, interleaved, latent_cache, slot_mapping, q_pe=None):
    """MLA's cache rows of new tokens from kv_a_proj_with_mqa's output [T, rank + rope]: the latent through
    kv_a_layernorm (norm_weight, eps), the rope part rotated by cos/sin (as apply_rotary), at slot_mapping.
    With q_pe [T, heads, rope]: returns the query's rope heads rotated (apply_rotary's result), same launch."""
    if use_triton(kv_a):
        from .cache_write import write_latent as impl
    else:
        from .reference import write_latent as impl
    return impl(kv_a, norm_weight, eps, cos, sin, interleaved, latent_cache, slot_mapping, q_pe)


def route(x, weight, bias, *, method, top_k, n_group, topk_group, normalise, scaling):
    """A MoE router (memcheck/kernels/router.py's methods): x [T, hidden], weight [experts, hidden], bias [experts] for
    noaux_tc -> (routing weights [T, top_k] float32, scaling included; expert ids [T, top_k])."""
    if use_triton(x):
        from .router import route as impl
    else:
        from .reference import route as impl
    return impl(x, weight, bias, method=method, top_k=top_k, n_group=n_group, topk_group=topk_group,
                normalise=normalise, scaling=scaling)


def fused_moe(x, gate_up, down, weights, ids, shared_gate_up=None, shared_down=None):
    """The experts of a MoE layer: each token through its top_k experts' gated MLPs, weighted, plus the shared
    experts' gated MLP. x [T, hidden]; gate_up [experts, 2 x inter, hidden]; down [experts, hidden, inter];
    weights [T, top_k] float32 (routing weights, scaling included); ids [T, top_k]; shared_gate_up
    [2 x S x inter, hidden] (S gate blocks, then S up blocks) and shared_down [hidden, S x inter], or None.
    Returns [T, hidden] in x's dtype."""
    if use_triton(x):
        from .moe import fused_moe as impl
    else:
        from .reference import fused_moe as impl
    return impl(x, gate_up, down, weights, ids, shared_gate_up, shared_down)


def rms_norm(x, weight, eps, residual=None):
    """weight * x / rms(x) over the last dim (transformers' roundings); with residual, x += residual first,
    in place (x then holds the new residual stream). One launch on CUDA."""
    if use_triton(x):
        from .norm import rms_norm as impl
    else:
        from .reference import rms_norm as impl
    return impl(x, weight, eps, residual)


def apply_rotary(x, cos, sin, interleaved: bool):
    """Rotary embedding of x [T, heads, D] by cos/sin [T, D/2]; a new contiguous tensor in x's dtype.
    (Not named `rotary`: that is the kernel's module, which importing would put in this name's place.)"""
    if use_triton(x):
        from .rotary import rotary as impl
    else:
        from .reference import rotary as impl
    return impl(x, cos, sin, interleaved)


def silu_mul_(gate_up):
    """gate_up [T, 2 x inter] -> its gate half [T, inter] (a view), overwritten with silu(gate) * up."""
    if use_triton(gate_up):
        from .activation import silu_mul_ as impl
    else:
        from .reference import silu_mul_ as impl
    return impl(gate_up)


def linear(x, weight, bias=None):
    """x [..., K] @ weight [N, K]^T (+ bias), as F.linear: a decode step's few rows, captured in a CUDA graph,
    through a Triton kernel where this GPU has a measured tile for the product (memcheck/kernels/skinny_gemm.py), cuBLAS
    otherwise; F.linear on the CPU."""
    if use_triton(x):
        from .skinny_gemm import linear as impl

        return impl(x, weight, bias)
    import torch.nn.functional as F

    return F.linear(x, weight, bias)
