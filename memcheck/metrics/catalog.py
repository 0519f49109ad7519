"""The metric names: a stable API, stored in baselines. Nothing else may invent a metric name."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str  # bytes | ratio | count | s | tokens/s
    meaning: str
    lower_is_worse: bool = False  # throughput: a drop is the regression
    noisy: bool = False  # compared only through repeated rounds
    # Bumped when the way it is measured changes: a baseline of an earlier revision is not compared.
    revision: int = 1
    revised: str = ""  # what changed at the last revision, for the report
    # Reported only by these stacks (empty: by every item): an item of another stack that does not report
    # it is not judged for it, rather than listed as not measured.
    stacks: tuple[str, ...] = ()
    predicted: bool = False  # reported only by predictions (--memcheck-predict), never by a measurement


_SPECS = [
    MetricSpec("gpu.heap_alloc.peak", "bytes", "peak bytes held by live tensors (torch caching allocator)"),
    MetricSpec("gpu.heap_alloc.end", "bytes", "bytes still held when the run ended (model still loaded), above what was held before it started"),
    MetricSpec("gpu.reserved.peak", "bytes", "peak bytes the torch allocator took from the driver"),
    MetricSpec("gpu.device_used.peak", "bytes", "peak device memory seen by the driver for this process and its children (NVML, sampled)"),
    MetricSpec("gpu.fragmentation.peak", "ratio", "inactive split bytes / reserved bytes, at the highest reserved "
               "bytes of the engine steps", revision=2,
               revised="revision 1 sampled the allocator every 10 ms on a thread, which slowed Python-bound stacks"),
    MetricSpec("gpu.alloc_retries", "count", "allocator frees-and-retries (cudaMalloc failed, cache flushed, retried)"),
    MetricSpec("gpu.ooms", "count", "out-of-memory events raised by the allocator"),
    MetricSpec("predicted.gpu.heap_alloc.peak", "bytes", "gpu.heap_alloc.peak predicted on a CPU runner: the run on "
               "fake CUDA tensors, its allocations replayed through a model of the caching allocator", predicted=True),
    MetricSpec("predicted.gpu.reserved.peak", "bytes", "gpu.reserved.peak predicted the same way", predicted=True),
    MetricSpec("predicted.gpu.heap_alloc.end", "bytes", "gpu.heap_alloc.end predicted the same way", predicted=True),
    MetricSpec("predicted.gpu.fragmentation.peak", "ratio", "gpu.fragmentation.peak predicted the same way",
               predicted=True),
    MetricSpec("predicted.gpu.ooms", "count", "out-of-memory events the allocator model raised at the GPU's capacity",
               predicted=True),
    MetricSpec("cpu.heap_alloc.peak", "bytes", "peak bytes of live torch CPU tensors, weights included (profiler memory events)"),
    MetricSpec("kv.bytes.peak", "bytes", "peak KV-cache bytes held for the running requests (blocks in use x "
               "bytes per block; a dense cache's tensors)",
               revision=2, revised="revision 1 counted vLLM's whole reserved block pool for vllm items"),
    MetricSpec("kv.live_bytes.peak", "bytes", "peak KV-cache bytes holding live tokens"),
    MetricSpec("kv.waste.peak", "ratio", "1 - live/held KV bytes at the held peak",
               revision=2, revised="revision 1 divided by vLLM's whole reserved block pool for vllm items"),
    MetricSpec("kv.pool_bytes", "bytes", "KV-cache bytes the engine reserved as its block pool when it started",
               stacks=("vllm",)),
    MetricSpec("kv.capacity_blocks", "count", "KV blocks the engine's pool has for requests", lower_is_worse=True,
               stacks=("vllm",)),
    MetricSpec("kv.max_concurrency", "count", "requests of max_model_len tokens the KV pool holds at once (vLLM's "
               "kv_cache_max_concurrency)", lower_is_worse=True, stacks=("vllm",)),
    MetricSpec("kv.blocks_unreclaimed", "count", "KV blocks still held by finished sequences at the end"),
    MetricSpec("kv.page_footprint", "count", "distinct 2 MiB pages the KV reads of one decode step touch (max over steps)"),
    MetricSpec("vllm.weights", "bytes", "device memory loading the weights took (vLLM's model_memory_usage)",
               stacks=("vllm",)),
    MetricSpec("vllm.activation.peak", "bytes", "torch allocator peak of vLLM's profile run above what it held "
               "before (MemoryProfilingResult.torch_peak_increase): activations", stacks=("vllm",)),
    MetricSpec("vllm.non_torch.increase", "bytes", "device memory outside torch's allocator from the worker's "
               "start to after the profile (MemoryProfilingResult.non_torch_increase)", stacks=("vllm",)),
    MetricSpec("vllm.cuda_graph.pool", "bytes", "device memory vLLM's CUDA graph capture took", stacks=("vllm",)),
    MetricSpec("host.heap_alloc.peak", "bytes", "peak Python heap during the run (tracemalloc, in a round of "
               "its own: the timed rounds run without it)",
               revision=2, revised="revision 1 read the peak after the stack was closed and the CPU-tensor "
               "profiler's events were processed, counting ~1 MB of the harness's own objects"),
    MetricSpec("host.rss.peak", "bytes", "peak resident set of the workload's process less its file-backed "
               "pages (VmHWM - RssFile): the anonymous + shared memory it held",
               revision=2, revised="revision 1 counted file-backed pages too (VmHWM)"),
    MetricSpec("host.page_faults", "count", "minor + major page faults during the run (getrusage)"),
    MetricSpec("host.gc_collections", "count", "Python garbage-collector passes during the run"),
    MetricSpec("host.dtlb_misses", "count", "data-TLB load misses during the run (perf_event_open)"),
    MetricSpec("time.wall", "s", "wall time of the run", noisy=True),
    MetricSpec("time.warmup", "s", "wall time of the stack's warm-up before the timed run (one-time JIT "
               "compilation, autotuning, CUDA-graph capture)", noisy=True),
    MetricSpec("tokens_per_s", "tokens/s", "generated tokens per second", lower_is_worse=True, noisy=True),
    MetricSpec("ttft", "s", "time to first token (mean over requests)", noisy=True),
    MetricSpec("tpot", "s", "time per output token after the first (mean)", noisy=True),
]

METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}


def spec(name: str) -> MetricSpec:
    return METRICS[name]


def reported_by(name: str, stack: str) -> bool:
    """Whether items of `stack` are expected to report the metric in a measurement (a prediction reports its own)."""
    stacks = METRICS[name].stacks
    return (not stacks or stack in stacks) and not METRICS[name].predicted


def markdown_table() -> str:
    """The catalog as the README prints it (`memcheck metrics`; a test keeps the README's copy equal)."""
    rows = ["| metric | unit | meaning |", "|---|---|---|"]
    for m in _SPECS:
        notes = [n for n, on in (("lower is worse", m.lower_is_worse), ("noisy: judged through rounds", m.noisy)) if on]
        notes += [f"{', '.join(m.stacks)} only"] if m.stacks else []
        notes += ["predictions only"] if m.predicted else []
        extra = f" ({'; '.join(notes)})" if notes else ""
        rows.append(f"| `{m.name}` | {m.unit} | {m.meaning}{extra} |")
    return "\n".join(rows) + "\n"
