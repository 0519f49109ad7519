"""The `hf` stack's attention implementation (transformers' `attn_implementation`): which one an item runs, and
whether it can run on this runner.

Plain `hf` passes none: it runs what `from_pretrained` gives users, the implementation transformers itself picks
for the model and version, and records it (`resolved`), so a release that switches a model's default shows as
`attention sdpa -> eager` beside its version. `hf:sdpa`, `hf:eager`, `hf:flash_attention_2` and `hf:flex_attention`
pin one. A pinned implementation this runner lacks (flash-attn not installed, no CUDA device) skips the item; one
that the installed transformers does not implement for the model no longer runs (with a baseline, the item
fails): it never falls back to another under the variant's name. In a composite model the implementation goes
to every part transformers implements it for; a part without it (DeepSeek-VL's SAM high-resolution tower has no
FlashAttention path) runs SDPA, and the item's notes say so.
"""
from __future__ import annotations

import importlib.metadata

from ..devices import is_cuda
from ..errors import SoftwareUnsupported, StackUnavailable

ATTENTIONS = ("sdpa", "eager", "flash_attention_2", "flex_attention")  # what `hf:NAME` may pin
FALLBACK = "sdpa"  # a composite model's part that lacks the pinned implementation
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


def check(attention: str, workload, device) -> None:
    """Raise StackUnavailable when this runner lacks what `attention` needs (a package, a CUDA device), and
    SoftwareUnsupported when the installed transformers or torch does not implement it for this workload."""
    if attention == "flash_attention_2":
        version = flash_attn_version()
        if version is None:
            raise StackUnavailable("flash-attn is not installed on this runner (transformers' flash_attention_2 "
                                   "needs it)")
        if not is_cuda(device):
            raise StackUnavailable(f"flash_attention_2 runs on CUDA only (flash-attn {version} is installed; this "
                                   f"runner runs {device})")
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            raise SoftwareUnsupported(f"flash-attn {version} is installed but transformers "
                                      f"{_version('transformers')} cannot use it (is_flash_attn_2_available() is false)")
    if attention == "flex_attention":
        from transformers.utils import is_torch_flex_attn_available

        if not is_torch_flex_attn_available():
            raise SoftwareUnsupported(f"torch {_version('torch')} has no flex_attention that transformers can use")
    top = model_class(workload)
    if not supports(top, attention):
        raise SoftwareUnsupported(f"transformers {_version('transformers')} implements {top.__name__} "
                                  f"without {attention}")


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
            parts[key] = FALLBACK
            notes.append(f"{key} ({cls.__name__}) has no {attention} in transformers: it runs {FALLBACK}")
        else:
            parts[key] = attention
    return (parts if notes else attention), notes


def resolved(model) -> str:
    """The implementation the built model runs, as transformers set it: 'sdpa', or with the parts that differ
    from the top level ('sdpa; high_res_vision_config eager')."""
    config = model.config
    top = config._attn_implementation
    parts = [f"{key} {part}" for key in sorted(getattr(config, "sub_configs", None) or {})
             if (part := getattr(getattr(config, key, None), "_attn_implementation", None)) not in (None, top)]
    return "; ".join([str(top), *parts])
