"""Analytic floors: the least memory any stack could use for a workload. Reported beside measured
peaks and always labelled as floors, never as measurements."""
from __future__ import annotations


def kv_bytes_per_token(text_config: dict, dtype_bytes: int) -> int:
    """Bytes one token's KV takes across all layers in the leanest cache for the architecture."""
    layers = text_config["num_hidden_layers"]
    if text_config.get("kv_lora_rank"):  # MLA: one latent vector (kv_c + k_pe) per token per layer
        return layers * (text_config["kv_lora_rank"] + text_config["qk_rope_head_dim"]) * dtype_bytes
    heads = text_config["num_attention_heads"]
    kv_heads = text_config.get("num_key_value_heads") or heads
    head_dim = text_config.get("head_dim") or text_config["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_floor(workload, dtype_bytes: int) -> int:
    """KV bytes if every request were resident at once with only its own tokens (static-batch peak).
    The last generated token is never fed back, so its KV is never stored."""
    per_token = kv_bytes_per_token(workload.preset.text_config(workload.model_config()), dtype_bytes)
    image = workload.image_tokens
    return per_token * sum(r.prompt_tokens + r.images * image + r.max_new_tokens - 1 for r in workload.request_list())


# How each floor is named in reports, in the order shown.
LABELS = (("kv", "KV"), ("weights", "weights"), ("weights+kv", "weights + KV"),
          ("workspace", "declared activation workspace"))


def describe(floors: dict) -> str:
    """One line for reports: 'KV 1.00 GiB · weights 14.2 GiB · ...' (labelled as floors by the caller)."""
    from .units import format_bytes

    return " · ".join(f"{label} {format_bytes(floors[key])}" for key, label in LABELS if floors.get(key) is not None)
