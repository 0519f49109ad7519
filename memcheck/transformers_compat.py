"""What differs between the transformers releases users run (4.44 to the newest 5.x), in one place: each
adapter is one concept, chosen by the installed version or by what the object offers, never sniffed elsewhere.

- Rope fields: 5.x configs carry `rope_parameters` (theta and scaling in one mapping, one per layer type for
  Gemma 3); 4.x takes `rope_theta`, `rope_scaling` (and `rope_local_base_freq`). 5.x still reads the 4.x form.
- The dtype keyword of `from_config`/`from_pretrained`: `dtype` from 4.56, `torch_dtype` before.
- The KV cache generate() hands a forward hook (`cache` from 5.25, `past_key_values` before): 5.x (and 4.56+) caches keep per-layer objects in `layers`;
  4.4x/4.5x DynamicCache, HybridCache and StaticCache keep `key_cache`/`value_cache` lists; models without a
  cache class (GPT-2 before 4.5x) pass tuples of (key, value) per layer.
"""
from __future__ import annotations

import importlib.metadata

# 5.x configs take `rope_parameters`; older ones `rope_theta` + `rope_scaling`.
ROPE_PARAMETERS_SINCE = (5, 0)
# from_config's dtype keyword was `torch_dtype` before 4.56.
DTYPE_KEYWORD_SINCE = (4, 56)


def version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def version_tuple() -> tuple[int, int]:
    parts = version().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return (0, 0)


def config_fields(config: dict) -> dict:
    """A config dict in the form the installed transformers reads (sub-configs included)."""
    if version_tuple() >= ROPE_PARAMETERS_SINCE:
        return config
    out = {k: config_fields(v) if isinstance(v, dict) and "model_type" in v else v for k, v in config.items()}
    rope = out.pop("rope_parameters", None)
    if isinstance(rope, dict):
        out.update(_rope_as_4x(rope))
    return out


def _rope_as_4x(rope: dict) -> dict:
    """`rope_parameters` as 4.x fields: theta apart, the scaling (when not the default) as `rope_scaling`.
    Per layer type (Gemma 3): the full-attention layers' as the model's, the sliding ones' theta as
    `rope_local_base_freq`."""
    if all(isinstance(v, dict) for v in rope.values()) and rope:
        fields = _rope_as_4x(rope.get("full_attention") or next(iter(rope.values())))
        local = rope.get("sliding_attention", {}).get("rope_theta")
        return {**fields, **({"rope_local_base_freq": local} if local is not None else {})}
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    fields = {"rope_scaling": scaling if scaling.get("rope_type", "default") != "default" else None}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in rope:
            fields[key] = rope[key]
    return fields


def text_config(config):
    """The language model's config of a composite config (itself otherwise): get_text_config() came in 4.45."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def dtype_kwargs(dtype) -> dict:
    """The keyword that gives from_config its dtype."""
    return {"dtype": dtype} if version_tuple() >= DTYPE_KEYWORD_SINCE else {"torch_dtype": dtype}


def cache_tensors(cache) -> list:
    """The tensors a generate() cache holds, whatever its release's layout (empty ones left out)."""
    import torch

    if cache is None:
        return []
    if isinstance(cache, (tuple, list)):  # legacy: ((key, value), ...) per layer
        return [t for item in cache for t in (cache_tensors(item) if isinstance(item, (tuple, list)) else [item])
                if isinstance(t, torch.Tensor) and t.numel()]
    if hasattr(cache, "layers"):  # 4.56+ and 5.x: one object per layer (keys, values, or a sliding window's)
        return [t for layer in cache.layers for t in vars(layer).values()
                if isinstance(t, torch.Tensor) and t.numel()]
    lists = [getattr(cache, name, None) for name in ("key_cache", "value_cache")]  # 4.4x / 4.5x caches
    return [t for per_layer in lists if isinstance(per_layer, list) for t in per_layer
            if isinstance(t, torch.Tensor) and t.numel()]


def forward_cache(output, kwargs: dict):
    """The cache a forward pass of generate() used: 5.25 names it `cache` (output field and keyword; reading
    `past_key_values` there warns on every step), earlier releases `past_key_values`."""
    for name in ("cache", "past_key_values"):
        found = output.get(name) if hasattr(output, "get") else getattr(output, name, None)
        if found is None:
            found = kwargs.get(name)
        if found is not None:
            return found
    return None


def cache_seq_length(cache, cache_position=None) -> int:
    """Tokens the cache holds per sequence. A legacy tuple: its keys' length on the sequence axis; 4.4x's
    HybridCache (Gemma 2) does not count them (get_seq_length() is None): the forward's last cache position + 1."""
    length = cache.get_seq_length() if hasattr(cache, "get_seq_length") else None
    if length is None and cache_position is not None and cache_position.numel():
        return int(cache_position.max()) + 1
    if length is None:
        tensors = cache_tensors(cache)
        return int(tensors[0].shape[-2]) if tensors else 0
    return int(length)


def known_model_types() -> set[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return set(CONFIG_MAPPING_NAMES)


def missing_model_types(model_types) -> list[str]:
    """Architectures among `model_types` this transformers does not implement (they came in a later release)."""
    known = known_model_types()
    return sorted(t for t in model_types if t not in known)


def rotary(language):
    """(inv_freq, attention_scaling) of a decoder stack's rotary embedding: on the model from 4.45 (Mistral and
    Qwen2 from 4.46), on each attention module before; attention_scaling (yarn's mscale) came with the former."""
    rope = getattr(language, "rotary_emb", None) or language.layers[0].self_attn.rotary_emb
    return rope.inv_freq, getattr(rope, "attention_scaling", 1.0)


def attention_scale(attention, head_dim: int) -> float:
    """The softmax scale of an attention module: its `scaling` from 4.48 (DeepSeek's yarn mscale folded in),
    head_dim ** -0.5 for the models that ran before it."""
    scaling = getattr(attention, "scaling", None)
    return float(scaling) if scaling is not None else head_dim ** -0.5
