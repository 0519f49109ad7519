"""KV-cache accounting for stacks built on transformers caches: bytes reserved, bytes live, pages touched.

Reads the cache tensors themselves after every forward pass, so the numbers are what the cache
really holds, not what a formula says it should.
"""
from __future__ import annotations

import time

from ..metrics.value import MetricValue
from ..transformers_compat import cache_seq_length, cache_tensors, forward_cache
from .pages import distinct_pages


def pages_touched(tensors) -> int:
    """Distinct 2 MiB pages spanned by the tensors' storage (a decode step reads all of them)."""
    import torch

    first = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    last = first + torch.tensor([t.numel() * t.element_size() - 1 for t in tensors], dtype=torch.int64)
    return distinct_pages(first, last)


class CacheWatcher:
    """A forward hook for generate(): tracks the cache after each step of each wave."""

    def __init__(self, collectors):
        self.collectors = collectors
        self.steps = 0
        self.reserved_peak = self.live_peak = 0
        self.waste_at_peak = None
        self.footprint = 0
        self.step_times: list[float] = []

    def begin_wave(self, prompt_lens: list[int], new_tokens: list[int], padded_width: int) -> None:
        self.prompt_lens, self.new_tokens, self.width = prompt_lens, new_tokens, padded_width
        self.step_times = []
        self._t = time.perf_counter()

    def after_forward(self, module, args, kwargs, output) -> None:
        cache = forward_cache(output, kwargs)
        tensors = cache_tensors(cache)
        if tensors and tensors[0].is_cuda:
            import torch

            torch.cuda.synchronize(tensors[0].device)  # honest step times
        now = time.perf_counter()
        self.step_times.append(now - self._t)
        self._t = now
        self.steps += 1
        if not tensors:
            return
        reserved = sum(t.numel() * t.element_size() for t in tensors)
        seq_len = cache_seq_length(cache, kwargs.get("cache_position"))
        # A static cache (4.4x's HybridCache, StaticCache) reserves more slots than tokens so far.
        capacity = max((t.shape[-2] for t in tensors if t.dim() == 4), default=seq_len)
        slots = len(self.prompt_lens) * max(seq_len, capacity)
        generated = seq_len - self.width
        live_tokens = sum(p + min(generated, n) for p, n in zip(self.prompt_lens, self.new_tokens))
        live = reserved * live_tokens // slots if slots else 0
        if reserved >= self.reserved_peak:
            self.reserved_peak, self.waste_at_peak = reserved, 1 - live / reserved
        self.live_peak = max(self.live_peak, live)
        self.footprint = max(self.footprint, pages_touched(tensors))
        self.collectors.step(self.steps, **{"kv.bytes": reserved, "kv.live_bytes": live})

    def metrics(self) -> dict[str, MetricValue]:
        if not self.reserved_peak:
            reason = "the model's cache exposed no tensors"
            return {k: MetricValue.null(reason) for k in
                    ("kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak", "kv.page_footprint")}
        return {
            "kv.bytes.peak": MetricValue(self.reserved_peak, detail="sum of the cache tensors' bytes"),
            "kv.live_bytes.peak": MetricValue(self.live_peak, detail="cache slots holding a live token"),
            "kv.waste.peak": MetricValue(self.waste_at_peak),
            "kv.page_footprint": MetricValue(self.footprint, detail="2 MiB pages spanned by the cache tensors"),
        }
