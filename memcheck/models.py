"""Build a transformers model from a workload's preset with seeded random weights. Never downloads."""
from __future__ import annotations

import os

from .devices import is_cuda
from . import transformers_compat as compat
from .errors import SoftwareUnsupported

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def torch_dtype(workload, device):
    import torch

    name = workload.dtype
    if name == "auto":  # bf16 where the hardware runs it fast, float32 on CPU runners
        name = "bfloat16" if is_cuda(device) else "float32"
    return getattr(torch, DTYPES[name])


def transformers_modules() -> tuple[str, ...]:
    """The transformers modules that building and running a preset's model imports: the fork server imports
    them once (memcheck/forkserver.py), instead of every round paying 2-3 s for them."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    from .presets import PRESETS

    names = sorted({model_type_to_module_name(t) for p in PRESETS.values() for t in _model_types(p.config)})
    return ("transformers.modeling_utils", "transformers.generation.utils", "transformers.models.auto.modeling_auto",
            *(f"transformers.models.{n}.modeling_{n}" for n in names))


def _model_types(config: dict) -> set[str]:
    """model_type of a config and of its sub-configs (a vision-language model's text and vision towers)."""
    found = {config["model_type"]} if "model_type" in config else set()
    for value in config.values():
        if isinstance(value, dict):
            found |= _model_types(value)
    return found


def hf_config(workload):
    """The workload's transformers config. Raises SoftwareUnsupported when this transformers lacks the architecture
    (a preset's model type arrived in a later release): the reason names the version."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: nothing here may reach a hub
    from transformers import AutoConfig

    config = compat.config_fields(dict(workload.model_config()))
    missing = compat.missing_model_types(_model_types(config))
    if missing:
        raise SoftwareUnsupported(f"transformers {compat.version()} does not implement {', '.join(missing)} "
                                  f"(model {workload.preset.name!r}; a later release does)")
    model_type = config.pop("model_type")
    return AutoConfig.for_model(model_type, **config)


def model_factory(workload):
    """The transformers auto class that builds this workload's model."""
    import transformers

    if workload.preset.family != "vision-language":
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForImageTextToText  # 4.46+; hf_config names an older release's missing model


def build_hf_model(workload, device, attn_implementation: str | dict | None = None, weights=None):
    """The workload's model on `device`, weights drawn from the workload's seed, in eval mode.
    `attn_implementation`: one for the whole model, or one per sub-config ("" = the top level); None: the one
    transformers picks for the model, as from_pretrained gives users.
    `weights`: a paged.seeded_weights.SeededWeights that records the seeded values instead (the parameters
    stay on the meta device, to be drawn one at a time by a tensor-parallel rank)."""
    import contextlib

    import torch

    config = hf_config(workload)
    pinned = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if pinned:
        config._attn_implementation = attn_implementation
    dtype = torch_dtype(workload, device)
    factory = model_factory(workload)
    torch.manual_seed(workload.seed)
    if is_cuda(device):
        torch.cuda.manual_seed_all(workload.seed)
    # Built directly on the device: a 7B model initialised on the CPU first would take minutes.
    with torch.device(device), (weights.recording() if weights is not None else contextlib.nullcontext()):
        model = factory.from_config(config, **compat.dtype_kwargs(dtype), **pinned)
    return model.eval()


def prompt_ids(workload, vocab_size: int) -> list[list[int]]:
    """Seeded random prompt token ids, one list per request (workload request order): text only,
    the image placeholders are added by `sequence_ids`.

    Ids avoid the low range, where presets keep their special tokens (bos/eos/pad), and the image
    placeholder id, which would be read as an image."""
    import torch

    gen = torch.Generator().manual_seed(workload.seed + 1)
    low = min(16, vocab_size // 2)
    image_id = image_token_id(workload)
    prompts = []
    for r in workload.request_list():
        ids = torch.randint(low, vocab_size, (r.prompt_tokens,), generator=gen)
        if r.tokens == "repeated":
            ids[:] = ids[0].item()
        if image_id is not None:
            ids[ids == image_id] = low
        prompts.append(ids.tolist())
    return prompts


def image_token_id(workload) -> int | None:
    return workload.model_config().get("image_token_id") if workload.image_tokens else None


def sequence_ids(workload, vocab_size: int) -> list[list[int]]:
    """Each request's full input: its images' placeholder tokens first (as in a chat turn that
    shows the images, then asks), then its text prompt."""
    image_id, per_image = image_token_id(workload), workload.image_tokens
    return [[image_id] * (r.images * per_image) + p if r.images else p
            for r, p in zip(workload.request_list(), prompt_ids(workload, vocab_size))]


def draw_pixels(workload, images: int) -> dict:
    """Seeded random pixels (float32, on the host) for `images` images at both towers' resolutions
    (DeepSeek-VL hybrid): the images of one arrival wave are drawn together, as the hf stack batches them."""
    import torch

    config = workload.model_config()
    low, high = config["vision_config"]["image_size"], config["high_res_vision_config"]["image_size"]
    gen = torch.Generator().manual_seed(workload.seed + 2)
    return {
        "pixel_values": torch.randn(images, 3, low, low, generator=gen),
        "high_res_pixel_values": torch.randn(images, 3, high, high, generator=gen),
    }


def image_pixels(workload, images: int, device, dtype) -> dict:
    """draw_pixels on the device, in the model's dtype."""
    return {k: v.to(device, dtype) for k, v in draw_pixels(workload, images).items()}
