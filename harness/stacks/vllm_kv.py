"""KV accounting of a vLLM engine, read from the engine's own structures: never estimated.

Read right after each `Scheduler.schedule()`, i.e. on the state the step's forward pass runs on:
blocks are allocated and every scheduled request's `num_computed_tokens` already counts the tokens
whose KV this forward writes. (After the step, `update_from_output` frees finished requests' blocks,
so reading there would miss each request's last, largest state.)

- reserved bytes: the bytes of the engine's allocated KV tensors (unique storages of the per-layer
  views the model runner binds): vLLM reserves its whole block pool when the engine starts.
- live bytes: tokens whose KV is stored (sum of `num_computed_tokens` of the scheduler's running
  requests) x bytes per token (each KV-cache group's page bytes / block size x its layers).
- blocks in use / unreclaimed: the block pool's own count (`num_gpu_blocks - 1 - free`, the null
  block excluded), the same figure vLLM's `kv_cache_usage` stat is made of.
- page footprint: distinct 2 MiB pages spanned by the blocks in the scheduled requests' block tables,
  in every layer's KV view (data pointers and strides of the real tensors).
"""
from __future__ import annotations

import time

from ..metrics.value import MetricValue

PAGE_SHIFT = 21  # 2 MiB pages, as harness.stacks.kv


def block_runs(view) -> list[tuple[int, int]]:
    """(byte offset, byte length) of the contiguous pieces of block 0 of a [blocks, ...] KV view."""
    block = view[0]
    shape, stride, size = list(block.shape), list(block.stride()), block.element_size()
    inner, k = 1, len(shape)
    while k and (stride[k - 1] == inner or shape[k - 1] == 1):
        inner *= shape[k - 1]
        k -= 1
    offsets = [0]
    for d in range(k):
        offsets = [o + i * stride[d] for o in offsets for i in range(shape[d])]
    return [(o * size, inner * size) for o in offsets]


class LayerView:
    """One layer's KV view: where manager block b lives in memory."""

    def __init__(self, tensor, num_blocks: int):
        import torch

        self.ptr = tensor.data_ptr()
        self.ratio = max(1, tensor.shape[0] // num_blocks)  # kernel blocks per manager block
        self.block_stride = tensor.stride(0) * tensor.element_size()
        runs = block_runs(tensor)
        self.run_offsets = torch.tensor([o for o, _ in runs], dtype=torch.int64)
        self.run_lengths = torch.tensor([n for _, n in runs], dtype=torch.int64)

    def pages(self, block_ids):
        import torch

        kernel = (block_ids[:, None] * self.ratio + torch.arange(self.ratio)).reshape(-1)
        starts = (self.ptr + kernel[:, None] * self.block_stride + self.run_offsets).reshape(-1)
        ends = starts + self.run_lengths.repeat(len(kernel)) - 1
        first, last = starts >> PAGE_SHIFT, ends >> PAGE_SHIFT
        out = [first, last]
        for a, b in zip(first[last - first > 1].tolist(), last[last - first > 1].tolist()):
            out.append(torch.arange(a + 1, b))  # a run longer than a page: the pages in between
        return torch.cat(out)


class EngineKV:
    """Observes one in-process vLLM EngineCore; `metrics()` gives the kv.* metrics of the run."""

    def __init__(self, core, probe):
        import torch

        self.scheduler = core.scheduler
        self.manager = self.scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.probe = probe
        config = self.scheduler.kv_cache_config
        self.num_blocks = self.pool.num_gpu_blocks
        runner = core.model_executor.driver_worker.worker.model_runner
        context = runner.compilation_config.static_forward_context
        storages, self.layers = {}, []  # layers: (kv-cache group, LayerView)
        self.token_bytes = 0
        for group_id, group in enumerate(config.kv_cache_groups):
            spec = group.kv_cache_spec
            self.token_bytes += spec.page_size_bytes // spec.block_size * len(group.layer_names)
            seen = set()
            for name in group.layer_names:
                kv = getattr(context.get(name), "kv_cache", None)
                if not isinstance(kv, torch.Tensor) or not kv.numel():
                    continue
                storage = kv.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
                key = (kv.data_ptr(), tuple(kv.stride()))
                if key not in seen:  # layers sharing another layer's KV are read once
                    seen.add(key)
                    self.layers.append((group_id, LayerView(kv, self.num_blocks)))
        self.reserved = sum(storages.values())
        self.steps = 0
        self.live_peak = self.blocks_peak = self.footprint = 0
        self.step_t: list[float] = []

    def watch(self) -> None:
        """Wrap the scheduler's schedule() so every step is observed on the state its forward runs on."""
        schedule = self.scheduler.schedule

        def observed(*args, **kwargs):
            output = schedule(*args, **kwargs)
            self.observe(output)
            return output

        self.scheduler.schedule = observed

    def blocks_used(self) -> int:
        return self.num_blocks - 1 - self.pool.get_num_free_blocks()  # block 0 is vLLM's null block

    def observe(self, output) -> None:
        import torch

        if not output.total_num_scheduled_tokens:
            return
        self.steps += 1
        live = sum(r.num_computed_tokens for r in self.scheduler.running) * self.token_bytes
        used = self.blocks_used()
        self.live_peak, self.blocks_peak = max(self.live_peak, live), max(self.blocks_peak, used)
        tables = [self.manager.get_block_ids(req_id) for req_id in output.num_scheduled_tokens]
        pages = []
        for group_id, layer in self.layers:
            ids = [b for table in tables for b in table[group_id] if b != 0]  # 0: the null block
            if ids:
                pages.append(layer.pages(torch.tensor(ids, dtype=torch.int64)))
        if pages:
            self.footprint = max(self.footprint, int(torch.unique(torch.cat(pages)).numel()))
        self.step_t.append(time.perf_counter())
        self.probe.step(self.steps, **{"kv.bytes": self.reserved, "kv.live_bytes": live, "kv.blocks_used": used})

    def metrics(self) -> dict[str, MetricValue]:
        if not self.reserved:
            reason = "the vLLM model runner bound no KV tensors"
            out = {k: MetricValue.null(reason) for k in ("kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak",
                                                         "kv.page_footprint")}
        else:
            out = {
                "kv.bytes.peak": MetricValue(self.reserved, detail=f"vLLM's KV tensors: {self.num_blocks} blocks "
                                                                   "reserved when the engine started"),
                "kv.live_bytes.peak": MetricValue(self.live_peak,
                                                  detail="scheduler's computed tokens x bytes per token"),
                "kv.waste.peak": MetricValue(1 - self.live_peak / self.reserved,
                                             detail="1 - live/reserved at the live peak (the pool is reserved whole)"),
                "kv.page_footprint": MetricValue(self.footprint, detail="2 MiB pages spanned by the scheduled "
                                                                        "requests' blocks, all layers"),
            }
        out["kv.blocks_unreclaimed"] = MetricValue(self.blocks_used(), detail="vLLM block pool: blocks not free "
                                                                              "after every request finished")
        return out
