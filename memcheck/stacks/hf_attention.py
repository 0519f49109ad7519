"""The `hf` stack's attention implementation (transformers' `attn_implementation`): which one an item runs, and
whether it can run on this runner.

`hf` runs SDPA; `hf:eager`, `hf:flash_attention_2` and `hf:flex_attention` run the others. An implementation
this runner lacks (flash-attn not installed, no CUDA device) or that transformers does not implement for the
model skips the item with that reason: it never falls back to SDPA under the variant's name. In a composite
model the implementation goes to every part transformers implements it for; a part without it (DeepSeek-VL's
SAM high-resolution tower has no FlashAttention path) keeps SDPA, and the item's notes say so.
"""
from __future__ import annotations

import importlib.metadata

from ..devices import is_cuda

ATTENTIONS = ("sdpa", "eager", "flash_attention_2", "flex_attention")  # the first is what plain `hf` runs
DEFAULT = ATTENTIONS[0]
# The class attribute by which transformers says a model implements an attention (eager: every model).
_SUPPORT_FLAG = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn",
                 "flex_attention": "_supports_flex_attn"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def flash_attn_version() -> str | None:
    return _version("flash-attn") or _version("flash_attn")


def unavailable(attention: str, workload, device) -> str | None:
    """Why `attention` cannot run this workload here, or None."""
    if attention == "flash_attention_2":
        version = flash_attn_version()
        if version is None:
            return "flash-attn is not installed on this runner (transformers' flash_attention_2 needs it)"
        if not is_cuda(device):
            return f"flash_attention_2 runs on CUDA only (flash-attn {version} is installed; this runner runs {device})"
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            return (f"flash-attn {version} is installed but transformers {_version('transformers')} cannot use it "
                    "(is_flash_attn_2_available() is false)")
    if attention == "flex_attention":
        from transformers.utils import is_torch_flex_attn_available

        if not is_torch_flex_attn_available():
            return f"torch {_version('torch')} has no flex_attention that transformers can use"
    top = model_class(workload)
    if not supports(top, attention):
        return f"transformers {_version('transformers')} implements {top.__name__} without {attention}"
    return None


def model_class(workload):
    """The transformers class `build_hf_model` instantiates for this workload."""
    from ..models import hf_config, model_factory

    return model_factory(workload)._model_mapping[type(hf_config(workload))]


def supports(cls, attention: str) -> bool:
    flag = _SUPPORT_FLAG.get(attention)
    return flag is None or bool(getattr(cls, flag, False))


def per_part(attention: str, workload) -> tuple[str | dict, list[str]]:
    """The `attn_implementation` to build the model with, and a note per part that keeps SDPA instead."""
    from transformers import AutoModel

    from ..models import hf_config

    config = hf_config(workload)
    parts, notes = {"": attention}, []
    for key in getattr(config, "sub_configs", {}):
        cls = AutoModel._model_mapping.get(type(getattr(config, key)), None)
        if cls is not None and not supports(cls, attention):
            parts[key] = DEFAULT
            notes.append(f"{key} ({cls.__name__}) has no {attention} in transformers: it runs {DEFAULT}")
        else:
            parts[key] = attention
    return (parts if notes else attention), notes
