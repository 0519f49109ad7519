"""Model presets: the published architectures, as transformers configs. The values are those of each model's
config.json on the Hugging Face Hub (deepseek-ai/DeepSeek-R1-Distill-Qwen-7B, deepseek-ai/deepseek-vl-7b-chat,
deepseek-ai/DeepSeek-V2-Lite, deepseek-ai/DeepSeek-V2, deepseek-ai/DeepSeek-V3); DeepSeek-VL's 576 image tokens
per image are deepseek_vl/models/processing_vlm.py's (github deepseek-ai/DeepSeek-VL).

Weights are never downloaded: a stack builds the model from this config and fills it with seeded
random weights. A workload may override any architecture field to scale the model down.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field

# Short names users write in workloads, mapped to the transformers config field.
ALIASES = {
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "experts": "n_routed_experts",
}
# Where a family names a field otherwise: the first of these a config has is what the alias sets
# (Qwen-MoE and Mixtral count experts in num_experts / num_local_experts, DeepSeek in n_routed_experts).
ALIAS_SPELLINGS = {"experts": ("n_routed_experts", "num_experts", "num_local_experts")}

_YARN_V2 = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
    "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0,
}


@dataclass(frozen=True)
class Preset:
    name: str
    model_type: str  # transformers model_type
    family: str  # dense | mla-moe | vision-language
    config: dict = field(default_factory=dict)
    # Vision-language presets: the language model's fields live in config["text_config"], and
    # top-level overrides apply there; the towers are overridden through `vision` / `high_res_vision`.
    text_key: str | None = None
    image_tokens: int = 0  # per image at the published resolution (576 for DeepSeek-VL)
    config_digest: str | None = None  # a user's config.json (from_config): its content's digest

    @property
    def identity(self) -> dict:
        """What the report says the model is: the preset, or the config file, its model_type and digest."""
        key = "config" if self.config_digest else "preset"
        return {key: self.name, "model_type": self.model_type,
                **({"config_digest": self.config_digest} if self.config_digest else {})}

    def text_config(self, config: dict) -> dict:
        return config[self.text_key] if self.text_key else config

    def field_name(self, key: str) -> str:
        """The config field a workload's `model:` key sets: an alias resolved for this config's family."""
        text = self.text_config(self.config)
        return next((name for name in ALIAS_SPELLINGS.get(key, ()) if name in text), ALIASES.get(key, key))

    def fields(self) -> set[str]:
        names = set(self.text_config(self.config)) | set(ALIASES)
        if self.text_key:
            names |= {key for key in ("vision", "high_res_vision") if f"{key}_config" in self.config}
        return names - {"model_type", "rope_parameters"}

    def resolve(self, overrides: dict) -> dict:
        """The preset's config with a workload's overrides applied (aliases resolved), kept valid: every list
        sized by the layer count or the rotary width follows the overridden value."""
        config = copy.deepcopy(self.config)
        text = self.text_config(config)
        for key, value in overrides.items():
            if key in ("vision", "high_res_vision") and self.text_key:
                config[f"{key}_config"].update(value)
            else:
                text[self.field_name(key)] = value
        original = self.text_config(self.config)
        fit_layer_lists(original, text)
        fit_rotary_lists(original, text)
        for key in ("vision", "high_res_vision"):  # the towers' own per-layer lists (SAM's global_attn_indexes)
            if self.text_key and key in overrides and f"{key}_config" in config:
                fit_layer_lists(self.config[f"{key}_config"], config[f"{key}_config"])
        if "num_key_value_heads" in text and "num_attention_heads" in text and "num_key_value_heads" not in overrides \
                and "kv_heads" not in overrides and text["num_key_value_heads"] > text["num_attention_heads"]:
            text["num_key_value_heads"] = text["num_attention_heads"]
        # A scaled-down vocabulary cannot hold the preset's special token ids: drop them
        # (generation runs with min_new_tokens, so no end-of-sequence token is needed).
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if _token_ids_beyond(text.get(key), text.get("vocab_size", 0)):
                text[key] = None
        if config.get("image_token_id", 0) >= text.get("vocab_size", 1 << 62):
            config["image_token_id"] = text["vocab_size"] - 1  # the placeholder must be a real token id
        return config

    def tokens_per_image(self, config: dict) -> int:
        """Image tokens one image becomes in the sequence: the low-resolution tower's patch grid."""
        if not self.text_key or not self.image_tokens:  # a user's other vision-language configs: text only
            return 0
        vision = config["vision_config"]
        return (vision["image_size"] // vision["patch_size"]) ** 2


# Lists that name layers by index (Qwen-MoE's dense layers, Llama 4's MoE layers, SAM's global-attention blocks):
# when the model loses layers, indices past the last one go.
LAYER_INDEX_LISTS = ("mlp_only_layers", "moe_layers", "global_attn_indexes", "full_attn_idxs")
# Lists whose length can match a small layer count by chance but never describe layers.
NOT_PER_LAYER = ("architectures", "eos_token_id", "bos_token_id", "pad_token_id")


def fit_layer_lists(original: dict, config: dict) -> None:
    """Keep every per-layer list of `config` (`layer_types`, Llama 4's `no_rope_layers`, any list as long as the
    original layer count) as long as its overridden `num_hidden_layers`: transformers 5 rejects a config whose
    `layer_types` disagrees with it, and a model built from a stale list indexes past its layers."""
    before, after = original.get("num_hidden_layers"), config.get("num_hidden_layers")
    if not isinstance(before, int) or not isinstance(after, int) or before == after:
        return
    for key, value in config.items():
        if not isinstance(value, list) or key in NOT_PER_LAYER:
            continue
        if key in LAYER_INDEX_LISTS:
            config[key] = [i for i in value if not isinstance(i, int) or i < after]
        elif len(value) == before and before:
            config[key] = repeat_to(value, after)


def repeat_to(pattern: list, length: int) -> list:
    """`pattern` cut to `length`, or repeated: a longer model continues the published layer pattern
    (Gemma 3's five sliding layers, then a global one)."""
    return [pattern[i % len(pattern)] for i in range(length)]


def rotary_half(config: dict) -> int | None:
    """Frequencies per head the rotary embedding has: half the rotated dimensions (head_dim x
    partial_rotary_factor), the length of a longrope config's long_factor and short_factor (Phi-3)."""
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and heads else None)
    if not isinstance(head_dim, int):
        return None
    return int(head_dim * (config.get("partial_rotary_factor") or 1.0)) // 2


def fit_rotary_lists(original: dict, config: dict) -> None:
    """Resample the per-frequency lists of the rope config (rope_scaling, or 5.x rope_parameters, also nested
    per layer type) when an override changes the head size: transformers checks their length."""
    before, after = rotary_half(original), rotary_half(config)
    if not before or not after or before == after:
        return
    for key in ("rope_scaling", "rope_parameters"):
        for rope in _rope_dicts(config.get(key)):
            for name, value in rope.items():
                if isinstance(value, list) and len(value) == before:
                    # nearest published factor for each new frequency: the curve keeps its shape
                    rope[name] = [value[i * (before - 1) // max(after - 1, 1)] for i in range(after)]


def _rope_dicts(rope) -> list[dict]:
    """The rope parameter mappings of a config: itself, or one per layer type (Gemma 3 in transformers 5)."""
    if not isinstance(rope, dict):
        return []
    nested = [v for v in rope.values() if isinstance(v, dict)]
    return nested or [rope]


def _token_ids_beyond(ids, vocab_size: int) -> bool:
    """Whether a special token id (or one of a list, as Gemma's eos ids) falls outside the vocabulary."""
    values = ids if isinstance(ids, list) else [ids]
    return any(isinstance(i, int) and i >= vocab_size for i in values)


# Keys of a model repository's config.json that describe the checkpoint, not the architecture: the
# workload's model.dtype decides the dtype, and the weights are random anyway.
CHECKPOINT_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")


def from_config(data, name: str) -> Preset:
    """A user's model from the config.json of a Hugging Face model repository, built like a preset.
    Raises ValueError naming what is wrong with it."""
    if not isinstance(data, dict):
        raise ValueError("a config.json is a JSON object")
    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError("has no model_type (the architecture's name in transformers, e.g. llama)")
    from . import transformers_compat as compat

    if compat.missing_model_types([model_type]):
        raise ValueError(f"model_type {model_type!r} is not an architecture transformers {compat.version()} knows "
                         "(a newer release may; models with remote code are not run)")
    if "quantization_config" in data:
        raise ValueError("quantization_config: quantized checkpoints are not supported (weights are random)")
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    config = canonical_names({k: v for k, v in data.items() if k not in CHECKPOINT_KEYS}, model_type)
    vision = isinstance(config.get("text_config"), dict) and isinstance(config.get("vision_config"), dict)
    family = "vision-language" if vision else "mla-moe" if config.get("kv_lora_rank") else "dense"
    # Vision-language configs other than DeepSeek-VL's run text only (the seeded pixels are DeepSeek-VL's).
    image_tokens = PRESETS["deepseek-vl-7b"].image_tokens if model_type == "deepseek_vl_hybrid" else 0
    return Preset(name, model_type, family, config, text_key="text_config" if vision else None,
                  image_tokens=image_tokens, config_digest=digest)


# Fields every family has, whatever its config.json calls them (GPT-2: n_layer, n_embd, n_head, n_positions).
CANONICAL = ("num_hidden_layers", "hidden_size", "num_attention_heads", "max_position_embeddings")


def canonical_names(config: dict, model_type: str) -> dict:
    """A config.json's fields under the names transformers maps them from (its config class's attribute_map),
    so that `layers: 2` and the per-layer fitting mean the same on every family."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    native = getattr(CONFIG_MAPPING[model_type], "attribute_map", {})
    renames = {native[name]: name for name in CANONICAL if name in native and name not in config}
    return {renames.get(k, k): v for k, v in config.items()}


PRESETS: dict[str, Preset] = {}


def _add(preset: Preset) -> None:
    PRESETS[preset.name] = preset


_add(Preset(
    "r1-distill-qwen-7b", "qwen2", "dense",
    {
        "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 131072, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "use_sliding_window": False, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "bos_token_id": 151643, "eos_token_id": 151643,
    },
))

_add(Preset(
    "deepseek-vl-7b", "deepseek_vl_hybrid", "vision-language",
    {
        "model_type": "deepseek_vl_hybrid",
        "text_config": {
            "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 102400,
            "max_position_embeddings": 16384, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "rms_norm_eps": 1e-6,
        },
        # siglip_large_patch16_384
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
            "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 384, "patch_size": 16,
        },
        # sam_b_downsample at 1024 px
        "high_res_vision_config": {
            "model_type": "sam_vision_model", "hidden_size": 768, "num_hidden_layers": 12,
            "num_attention_heads": 12, "image_size": 1024, "patch_size": 16, "output_channels": 256,
            "global_attn_indexes": [2, 5, 8, 11],
        },
        "image_token_id": 100015,
    },
    text_key="text_config",
    image_tokens=576,
))

_V2_COMMON = {
    "model_type": "deepseek_v2", "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "vocab_size": 102400, "max_position_embeddings": 163840, "rope_parameters": _YARN_V2,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "bos_token_id": 100000, "eos_token_id": 100001,
}

_add(Preset(
    "deepseek-v2-lite", "deepseek_v2", "mla-moe",
    {
        **_V2_COMMON, "num_hidden_layers": 27, "hidden_size": 2048, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_key_value_heads": 16,
        "q_lora_rank": None, "n_routed_experts": 64, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 1.0,
    },
))

_add(Preset(
    "deepseek-v2", "deepseek_v2", "mla-moe",
    {
        **_V2_COMMON, "num_hidden_layers": 60, "hidden_size": 5120, "intermediate_size": 12288,
        "moe_intermediate_size": 1536, "num_attention_heads": 128, "num_key_value_heads": 128,
        "q_lora_rank": 1536, "n_routed_experts": 160, "topk_method": "group_limited_greedy", "n_group": 8,
        "topk_group": 3, "routed_scaling_factor": 16.0,
    },
))

_add(Preset(
    "deepseek-v3", "deepseek_v3", "mla-moe",
    {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
        "routed_scaling_factor": 2.5, "vocab_size": 129280, "max_position_embeddings": 163840,
        "rope_parameters": {**_YARN_V2, "mscale": 1.0, "mscale_all_dim": 1.0},
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
    },
))
