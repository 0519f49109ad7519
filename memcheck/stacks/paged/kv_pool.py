"""The KV pool: one allocation holding every layer's paged cache, handed to the attention layers as
per-layer views, and the accounting read off it (bytes per block, pages a step's reads touch).

Dense layers get K and V [num_blocks, block_size, kv_heads, head_dim]; MLA layers get the latent
[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]. Block b of every layer belongs to the same
sequence, so one block table serves all layers."""
from __future__ import annotations

import torch

from ..pages import distinct_pages
from .config import EngineConfig, ModelSpec


class KVPool:
    def __init__(self, model, spec: ModelSpec, cfg: EngineConfig, dtype: torch.dtype, device):
        layers = model.model.layers
        if spec.mla:
            self.tensor = torch.zeros(spec.layers, cfg.num_blocks, cfg.block_size, spec.latent_width,
                                      dtype=dtype, device=device)
            self.caches = list(self.tensor.unbind(0))
            for layer, cache in zip(layers, self.caches):
                layer.self_attn.latent_cache = cache
        else:
            self.tensor = torch.zeros(spec.layers, 2, cfg.num_blocks, cfg.block_size, spec.kv_heads, spec.head_dim,
                                      dtype=dtype, device=device)
            self.caches = []
            for layer, kv in zip(layers, self.tensor.unbind(0)):
                layer.self_attn.k_cache, layer.self_attn.v_cache = kv.unbind(0)
                self.caches += [layer.self_attn.k_cache, layer.self_attn.v_cache]
        self.block_size = cfg.block_size
        self.block_bytes = self.tensor.numel() * self.tensor.element_size() // cfg.num_blocks  # all layers
        self.token_bytes = self.block_bytes // cfg.block_size
        first = self.caches[0]
        self._block_stride = first.stride(0) * first.element_size()  # bytes, within one cache tensor
        self._token_stride = first.stride(1) * first.element_size()
        self._bases = torch.tensor([c.data_ptr() for c in self.caches], dtype=torch.int64)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def page_footprint(self, reads: list[tuple[list[int], int]]) -> int:
        """Distinct 2 MiB pages touched by reading, in every layer's cache tensors, the first `length`
        tokens of each (block_table, length): exactly the K/V (or latent) rows the step's attention reads."""
        starts, sizes = [], []
        for table, length in reads:
            full, rest = divmod(length, self.block_size)
            starts += table[:full + (rest > 0)]
            sizes += [self.block_size] * full + ([rest] if rest else [])
        if not starts:
            return 0
        first = torch.tensor(starts, dtype=torch.int64) * self._block_stride
        last = first + torch.tensor(sizes, dtype=torch.int64) * self._token_stride - 1
        return distinct_pages((self._bases[:, None] + first[None, :]).flatten(),
                              (self._bases[:, None] + last[None, :]).flatten())
