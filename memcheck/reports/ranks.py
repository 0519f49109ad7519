"""Tensor-parallel items in the reports: the per-rank metrics shown under the item (its own metrics
are the maximum across ranks), in the order a reviewer reads them."""
from __future__ import annotations

RANK_METRICS = ("kv.bytes.peak", "kv.live_bytes.peak", "gpu.heap_alloc.peak", "gpu.reserved.peak",
                "gpu.device_used.peak", "cpu.heap_alloc.peak", "host.rss.peak", "time.wall")


def rank_columns(ranks: list[dict], names=RANK_METRICS) -> list[str]:
    """The metrics of `names` that at least one rank measured."""
    return [n for n in names if any(isinstance((r.get("metrics") or {}).get(n), (int, float)) for r in ranks)]
