"""One line for a vllm item in the reports: vLLM's memory profile of its start and its KV pool, read
from the engine (memcheck/stacks/vllm_profile.py, vllm_kv.py), so a reviewer sees where the GPU peak went."""
from __future__ import annotations

from .. import units
from ..metrics.catalog import METRICS

PARTS = (("vllm.weights", "weights"), ("vllm.activation.peak", "activation peak"),
         ("vllm.non_torch.increase", "non-torch"), ("vllm.cuda_graph.pool", "CUDA graph pool"),
         ("kv.pool_bytes", "KV pool"), ("kv.capacity_blocks", "KV blocks"),
         ("kv.max_concurrency", "max concurrency"))


def describe(metrics: dict) -> str:
    """'weights 14.2 GiB · activation peak 1.1 GiB · ...' over the measured parts; '' for an item without them."""
    shown = []
    for name, label in PARTS:
        value = metrics.get(name)
        if value is not None and value.value is not None:
            shown.append(f"{label} {units.format_value(value.value, METRICS[name].unit)}")
    return " · ".join(shown)
