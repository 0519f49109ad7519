"""KV metrics read off the engine after every step: bytes of the blocks held (what the pool really
gives out), bytes holding computed tokens, waste at the reserved peak, blocks never handed back,
and the 2 MiB pages a decode step's KV reads touch."""
from __future__ import annotations

from ...metrics.value import MetricValue
from .block_manager import BlockManager
from .kv_pool import KVPool


def _covers(later: list[tuple[list[int], int]], earlier: list[tuple[list[int], int]], block_size: int) -> bool:
    """Whether every KV row `earlier` read is read again by `later`: each (block_table, length) of
    earlier is read at least as far by a read of later over the same leading blocks."""
    by_first = {table[0]: (table, length) for table, length in later if table}
    for table, length in earlier:
        read = by_first.get(table[0]) if table else None
        blocks = -(-length // block_size)
        if read is None or read[1] < length or read[0][:blocks] != table[:blocks]:
            return False
    return True


class KVMeter:
    """Per step, only what is cheap: bytes held and live, and the step's decode reads kept when the next
    step does not read them all again. The page footprint is computed after the run from those: a
    step whose reads the next step covers touches no page that step does not, so the max over the
    kept steps is the max over all steps (the same number the per-step computation gave, at a cost
    that no longer lands inside the timed steps)."""

    def __init__(self, pool: KVPool, blocks: BlockManager, collectors):
        self.pool, self.blocks, self.collectors = pool, blocks, collectors
        self.reserved_peak = self.live_peak = 0
        self.waste_at_peak = 0.0
        self.decode_steps = 0
        self._last: list[tuple[list[int], int]] = []  # the previous step's decode reads
        self._kept: list[list[tuple[list[int], int]]] = []  # reads no later step covered

    def after_step(self, step: int, running, decoded) -> None:
        """running: sequences holding blocks; decoded: (block table, cached tokens read) of this step's decode
        rows, in lists of their own (a step's may be kept past it, so not the sequences' live tables)."""
        reserved = self.blocks.blocks_held * self.pool.block_bytes
        live = sum(s.num_computed for s in running) * self.pool.token_bytes
        if reserved and reserved >= self.reserved_peak:
            self.reserved_peak, self.waste_at_peak = reserved, 1 - live / reserved
        self.live_peak = max(self.live_peak, live)
        if self._last and not _covers(decoded, self._last, self.pool.block_size):
            self._kept.append(self._last)
        self._last = decoded
        if decoded:
            self.decode_steps += 1
        self.collectors.step(step, **{"kv.bytes": reserved, "kv.live_bytes": live})

    def page_footprint(self) -> int:
        return max(self.pool.page_footprint(reads) for reads in [*self._kept, self._last] if reads)

    def metrics(self) -> dict[str, MetricValue]:
        footprint = (MetricValue(self.page_footprint(), detail="2 MiB pages under the blocks one decode step reads, "
                                                               "all layers, from block tables and data pointers")
                     if self.decode_steps else MetricValue.null("no decode step ran (one new token per request)"))
        return {
            "kv.bytes.peak": MetricValue(self.reserved_peak, detail="blocks held x bytes per block (all layers)"),
            "kv.live_bytes.peak": MetricValue(self.live_peak, detail="tokens whose K/V is in the cache"),
            "kv.waste.peak": MetricValue(self.waste_at_peak),
            "kv.blocks_unreclaimed": MetricValue(self.blocks.blocks_held, detail="blocks held after every request ended"),
            "kv.page_footprint": footprint,
        }
