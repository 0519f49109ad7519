"""KV metrics read off the engine after every step: bytes of the blocks held (what the pool really
gives out), bytes holding computed tokens, waste at the reserved peak, blocks never handed back,
and the 2 MiB pages a decode step's KV reads touch."""
from __future__ import annotations

from kernels import BlockManager

from ...metrics.value import MetricValue
from .kv_pool import KVPool


class KVMeter:
    def __init__(self, pool: KVPool, blocks: BlockManager, probe):
        self.pool, self.blocks, self.probe = pool, blocks, probe
        self.reserved_peak = self.live_peak = 0
        self.waste_at_peak = 0.0
        self.footprint = 0
        self.decode_steps = 0

    def after_step(self, step: int, running, decoded) -> None:
        """running: sequences holding blocks; decoded: (sequence, cached tokens read) of this step's decode rows."""
        reserved = self.blocks.blocks_held * self.pool.block_bytes
        live = sum(s.num_computed for s in running) * self.pool.token_bytes
        if reserved and reserved >= self.reserved_peak:
            self.reserved_peak, self.waste_at_peak = reserved, 1 - live / reserved
        self.live_peak = max(self.live_peak, live)
        if decoded:
            self.decode_steps += 1
            self.footprint = max(self.footprint, self.pool.page_footprint(decoded))
        self.probe.step(step, **{"kv.bytes": reserved, "kv.live_bytes": live})

    def metrics(self) -> dict[str, MetricValue]:
        footprint = (MetricValue(self.footprint, detail="2 MiB pages under the blocks one decode step reads, "
                                                        "all layers, from block tables and data pointers")
                     if self.decode_steps else MetricValue.null("no decode step ran (one new token per request)"))
        return {
            "kv.bytes.peak": MetricValue(self.reserved_peak, detail="blocks held x bytes per block (all layers)"),
            "kv.live_bytes.peak": MetricValue(self.live_peak, detail="tokens whose K/V is in the cache"),
            "kv.waste.peak": MetricValue(self.waste_at_peak),
            "kv.blocks_unreclaimed": MetricValue(self.blocks.blocks_held, detail="blocks held after every request ended"),
            "kv.page_footprint": footprint,
        }
