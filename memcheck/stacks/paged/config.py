"""Plain data: the architecture the paged model implements (read off the transformers config the
`hf` stack builds) and the engine's settings (read off the workload's `engine:` mapping)."""
from __future__ import annotations

from dataclasses import dataclass

from ...transformers_compat import text_config

DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's default token budget with chunked prefill


# Decoder layouts the paged model implements (transformers model_type of the language model): q/k/v/o and
# gate/up/down projections, RMSNorm, rotary positions; DeepSeek's MLA and MoE.
IMPLEMENTED = ("llama", "mistral", "qwen2", "deepseek_v2", "deepseek_v3")


@dataclass
class ModelSpec:
    model_type: str
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    o_bias: bool = False
    mlp_bias: bool = False
    # multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 means plain (GQA/MHA) attention
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False  # DeepSeek lays rotary dims out in (even, odd) pairs
    # mixture of experts; n_routed_experts 0 means every layer is dense
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    first_k_dense_replace: int = 0
    topk_method: str = "greedy"  # greedy | group_limited_greedy (V2, softmax) | noaux_tc (V3, sigmoid)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def latent_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, i: int) -> bool:
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Cache bytes of one token over all layers: the 576-wide latent for MLA, K and V otherwise."""
        row = self.latent_width if self.mla else 2 * self.kv_heads * self.head_dim
        return self.layers * row * dtype_bytes

    @classmethod
    def from_hf(cls, config) -> "ModelSpec":
        c = text_config(config)
        if c.model_type not in IMPLEMENTED:
            raise ValueError(f"the paged stack implements the {', '.join(IMPLEMENTED)} architectures, "
                             f"not {c.model_type}")
        if getattr(c, "hidden_act", "silu") != "silu":
            raise ValueError(f"the paged stack implements SiLU-gated MLPs, not {c.hidden_act!r}")
        heads = c.num_attention_heads
        spec = cls(
            model_type=c.model_type, layers=c.num_hidden_layers, hidden=c.hidden_size,
            intermediate=c.intermediate_size, vocab=c.vocab_size, heads=heads,
            kv_heads=getattr(c, "num_key_value_heads", None) or heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, eps=c.rms_norm_eps,
            mlp_bias=bool(getattr(c, "mlp_bias", False)),
        )
        bias = bool(getattr(c, "attention_bias", False))
        spec.qkv_bias, spec.o_bias = (True, False) if c.model_type == "qwen2" else (bias, bias)
        if getattr(c, "kv_lora_rank", None):
            spec.q_lora_rank = c.q_lora_rank or 0
            spec.kv_lora_rank, spec.qk_rope_head_dim = c.kv_lora_rank, c.qk_rope_head_dim
            spec.qk_nope_head_dim, spec.v_head_dim = c.qk_nope_head_dim, c.v_head_dim
            # V2 rotates complex pairs (interleaved); V3 does when rope_interleave is set (its default).
            spec.rope_interleave = c.model_type == "deepseek_v2" or bool(getattr(c, "rope_interleave", False))
        if getattr(c, "n_routed_experts", None):
            spec.n_routed_experts, spec.top_k = c.n_routed_experts, c.num_experts_per_tok
            spec.n_shared_experts = c.n_shared_experts or 0
            spec.moe_intermediate, spec.first_k_dense_replace = c.moe_intermediate_size, c.first_k_dense_replace
            spec.n_group, spec.topk_group = c.n_group or 1, c.topk_group or 1
            spec.routed_scaling_factor = float(c.routed_scaling_factor)
            if c.model_type == "deepseek_v3":
                spec.topk_method, spec.norm_topk_prob = "noaux_tc", bool(c.norm_topk_prob)
            else:
                spec.topk_method = c.topk_method
            if spec.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
                raise ValueError(f"unknown MoE routing {spec.topk_method!r}")
        return spec


@dataclass
class EngineConfig:
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int  # tokens one forward pass may carry: decodes plus prefill chunks
    chunked_prefill: bool = True
    num_blocks_source: str = "engine.num_blocks"
    cuda_graphs: bool = True  # decode steps replay CUDA graphs (on CUDA); engine.cuda_graphs / enforce_eager

    @classmethod
    def from_workload(cls, workload, requests) -> "EngineConfig":
        per_image = workload.image_tokens
        e = workload.engine
        block_size = int(e.get("block_size", DEFAULT_BLOCK_SIZE))
        chunked = bool(e.get("chunked_prefill", True))
        budget = int(e.get("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS))
        if not chunked:  # every prompt must then go through in one forward pass
            budget = max(budget, max(input_tokens(r, per_image) for r in requests))
        if "num_blocks" in e:
            num_blocks, source = int(e["num_blocks"]), "engine.num_blocks"
        else:  # room for every request at its longest, all at once: the static-batch floor, in blocks
            num_blocks = sum(blocks_needed(r, block_size, per_image) for r in requests)
            source = "the workload's total need"
        max_len = e.get("max_model_len")
        for r in requests:
            if max_len and input_tokens(r, per_image) + r.max_new_tokens > max_len:
                raise ValueError(f"a request of {input_tokens(r, per_image)}+{r.max_new_tokens} tokens exceeds "
                                 f"engine.max_model_len ({max_len})")
            if blocks_needed(r, block_size, per_image) > num_blocks:
                raise ValueError(f"a request of {input_tokens(r, per_image)}+{r.max_new_tokens} tokens needs "
                                 f"{blocks_needed(r, block_size, per_image)} KV blocks; the pool has {num_blocks}")
        graphs = bool(e.get("cuda_graphs", True)) and not e.get("enforce_eager", False)
        return cls(block_size, num_blocks, int(e.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS)), budget, chunked, source,
                   graphs)


def input_tokens(request, image_tokens: int = 0) -> int:
    """Tokens a request feeds before its first new one: its images' placeholders and its prompt."""
    return request.prompt_tokens + request.images * image_tokens


def blocks_needed(request, block_size: int, image_tokens: int = 0) -> int:
    """Blocks a request holds at its longest: the last new token is never fed back, so never cached."""
    return -(-(input_tokens(request, image_tokens) + request.max_new_tokens - 1) // block_size)
