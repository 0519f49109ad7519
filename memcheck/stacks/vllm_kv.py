"""KV accounting of a vLLM engine, read from the engine's own structures: never estimated.

Read right after each `Scheduler.schedule()`, i.e. on the state the step's forward pass runs on:
blocks are allocated and every scheduled request's `num_computed_tokens` already counts the tokens
whose KV this forward writes. (After the step, `update_from_output` frees finished requests' blocks,
so reading there would miss each request's last, largest state.)

- pool bytes (kv.pool_bytes): the bytes of the engine's allocated KV tensors (unique storages of the
  per-layer views the model runner binds): vLLM reserves its whole block pool when the engine starts.
- blocks in use / unreclaimed: the block pool's own count (`num_gpu_blocks - 1 - free`, the null
  block excluded), the same figure vLLM's `kv_cache_usage` stat is made of.
- held bytes (kv.bytes.peak): blocks in use x bytes per block (pool bytes / blocks), as for the
  other stacks: what the workload's requests hold, whatever pool vLLM reserved around them.
- live bytes: tokens whose KV is stored (sum of `num_computed_tokens` of the scheduler's running
  requests) x bytes per token (each KV-cache group's page bytes / block size x its layers).
- capacity: the pool's blocks for requests (the null block excluded) and vLLM's own
  `kv_cache_max_concurrency`: requests of max_model_len tokens (the workload's longest request
  unless the workload sets max_model_len) the pool holds at once.
- page footprint: distinct 2 MiB pages spanned by the blocks in the scheduled requests' block tables,
  in every layer's KV view (data pointers and strides of the real tensors).
"""
from __future__ import annotations

import time

from ..metrics.value import MetricValue
from .pages import pages_spanned



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
        return pages_spanned(starts, ends)


class EngineKV:
    """Observes one in-process vLLM EngineCore; `metrics()` gives the kv.* metrics of the run."""

    def __init__(self, core, collectors):
        import torch

        self.scheduler = core.scheduler
        self.max_concurrency = core.vllm_config.cache_config.kv_cache_max_concurrency
        self.manager = self.scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.collectors = collectors
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
        self.waste_at_peak = 0.0
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

    def held_bytes(self, blocks: int) -> int:
        return blocks * self.reserved // self.num_blocks

    def observe(self, output) -> None:
        import torch

        if not output.total_num_scheduled_tokens:
            return
        self.steps += 1
        live = sum(r.num_computed_tokens for r in self.scheduler.running) * self.token_bytes
        used = self.blocks_used()
        held = self.held_bytes(used)
        if held and used >= self.blocks_peak:
            self.blocks_peak, self.waste_at_peak = used, 1 - live / held
        self.live_peak = max(self.live_peak, live)
        tables = [self.manager.get_block_ids(req_id) for req_id in output.num_scheduled_tokens]
        pages = []
        for group_id, layer in self.layers:
            ids = [b for table in tables for b in table[group_id] if b != 0]  # 0: the null block
            if ids:
                pages.append(layer.pages(torch.tensor(ids, dtype=torch.int64)))
        if pages:
            self.footprint = max(self.footprint, int(torch.unique(torch.cat(pages)).numel()))
        self.step_t.append(time.perf_counter())
        self.collectors.step(self.steps, **{"kv.bytes": held, "kv.live_bytes": live, "kv.blocks_used": used})

    def metrics(self) -> dict[str, MetricValue]:
        if not self.reserved:
            reason = "the vLLM model runner bound no KV tensors"
            out = {k: MetricValue.null(reason) for k in ("kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak",
                                                         "kv.page_footprint", "kv.pool_bytes")}
        else:
            out = {
                "kv.bytes.peak": MetricValue(self.held_bytes(self.blocks_peak),
                                             detail=f"vLLM block pool: {self.blocks_peak} blocks in use at the peak "
                                                    "x bytes per block"),
                "kv.live_bytes.peak": MetricValue(self.live_peak,
                                                  detail="scheduler's computed tokens x bytes per token"),
                "kv.waste.peak": MetricValue(self.waste_at_peak, detail="1 - live/held at the held peak"),
                "kv.page_footprint": MetricValue(self.footprint, detail="2 MiB pages spanned by the scheduled "
                                                                        "requests' blocks, all layers"),
                "kv.pool_bytes": MetricValue(self.reserved, detail=f"vLLM's KV tensors: {self.num_blocks} blocks "
                                                                   "reserved when the engine started"),
            }
        out["kv.blocks_unreclaimed"] = MetricValue(self.blocks_used(), detail="vLLM block pool: blocks not free "
                                                                              "after every request finished")
        out["kv.capacity_blocks"] = MetricValue(self.num_blocks - 1, detail="vLLM block pool, its null block "
                                                                            "excluded")
        out["kv.max_concurrency"] = (
            MetricValue(self.max_concurrency, detail="vLLM's kv_cache_max_concurrency at max_model_len (its "
                                                     "pool's blocks, null block included, per request)")
            if self.max_concurrency is not None else MetricValue.null("vLLM did not resolve its KV capacity"))
        return out
