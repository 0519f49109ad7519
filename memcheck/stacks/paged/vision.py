"""Image inputs (DeepSeek-VL): the hybrid towers (SigLIP + SAM) and the aligner are the transformers
modules themselves, taken from the model the `hf` stack builds, not rewritten. Each image becomes
tokens_per_image rows of language-model embeddings that replace its placeholder tokens.

Images go through the towers one at a time (the SAM tower's global attention over its 64 x 64 patch
grid is the largest transient of the whole model), when the request's prefill first reaches them;
the features are dropped once the prefill has passed the placeholders (a preempted request encodes
them again). A wave's pixels are drawn once, on the host, and kept until its last image is encoded; each
image goes to the device alone (vl-mixed-batch drew its 7-image wave once per image request, three times:
0.26 s a draw at full resolution on a 2-core runner, inside the timed run)."""
from __future__ import annotations

from itertools import groupby

import torch

from ...devices import is_cuda
from ...models import draw_pixels


class VisionEncoder:
    def __init__(self, vl_model, workload, device, dtype):
        self.model = vl_model  # DeepseekVLHybridModel without its language model
        self.workload, self.device, self.dtype = workload, device, dtype
        self.images_encoded = 0
        self._waves: dict[int, list] = {}  # images in a wave: [its host pixels, images not yet encoded]

    @torch.inference_mode()
    def encode(self, source: tuple[int, int, int]) -> torch.Tensor:
        """(images in the wave, offset, count) -> [count * tokens_per_image, hidden]."""
        total, offset, count = source
        # waves of equal size draw equal pixels (one seed), so the size is the key; a miss only draws again
        wave = self._waves.setdefault(total, [None, total])
        if wave[0] is None:
            wave[0] = draw_pixels(self.workload, total)
        features = [self._features(wave[0], i) for i in range(offset, offset + count)]
        wave[1] -= count
        if wave[1] <= 0:
            del self._waves[total]
        self.images_encoded += count
        return torch.cat(features)

    @torch.inference_mode()
    def warmup(self) -> None:
        """One image through the towers as the run sends each (one at a time, the workload's resolutions and
        dtype; not counted in images_encoded), so that on CUDA their one-time work (kernel modules loaded on
        first launch, cuDNN and cuBLAS set up for their shapes) happens before the timed run. Their transient
        segments then go back to the driver, as the graph capture just before gave its own back: the run starts
        from the allocator state it started from without this pass, so it takes the same segments and reaches
        the same peaks (with cuda_graphs off, the warm-up prefill's cached segments go back here too)."""
        self._features(draw_pixels(self.workload, 1), 0)
        if is_cuda(self.device):
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def _features(self, pixels: dict, i: int) -> torch.Tensor:
        """Image i of the drawn (host) pixels -> [tokens_per_image, hidden]."""
        low, high = (pixels[k][i:i + 1].to(self.device, self.dtype) for k in ("pixel_values", "high_res_pixel_values"))
        out = self.model.get_image_features(low, high, return_dict=True)
        return out.pooler_output.flatten(0, 1)

    def parameters(self):
        return self.model.parameters()


def image_sources(requests) -> list[tuple[int, int, int] | None]:
    """Which seeded images each request shows: the `hf` stack draws the images of one arrival wave
    together (memcheck.models.image_pixels) and hands them out in request order; so does this."""
    sources: list = [None] * len(requests)
    for _, wave in groupby(range(len(requests)), key=lambda i: requests[i].arrival_step):
        wave = list(wave)
        total, offset = sum(requests[i].images for i in wave), 0
        for i in wave:
            if requests[i].images:
                sources[i] = (total, offset, requests[i].images)
            offset += requests[i].images
    return sources


def tower_bytes(config, dtype_bytes: int) -> int:
    """Peak transient of the towers on one image (config: the transformers DeepseekVLHybridConfig):
    the largest attention map (scores, their float32 softmax and the cast back, SAM's decomposed
    relative positions), the hidden states the SAM pass keeps for every layer, and the pixels."""
    e = dtype_bytes
    low, high = config.vision_config, config.high_res_vision_config
    n_low = (low.image_size // low.patch_size) ** 2
    grid = high.image_size // high.patch_size
    n_high = grid * grid
    siglip = low.num_attention_heads * n_low * n_low * (2 * e + 4) + 2 * n_low * low.intermediate_size * e
    sam_attn = high.num_attention_heads * n_high * (n_high * (3 * e + 4) + 2 * grid * 4)
    sam_states = (high.num_hidden_layers + 2) * n_high * high.hidden_size * e
    pixels = 3 * (low.image_size ** 2 + high.image_size ** 2) * e
    return max(siglip, sam_attn + sam_states) + pixels
