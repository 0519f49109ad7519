"""The stack contract: every hook a stack may implement, in the order the harness calls them.

A stack is one class, subclassing Stack, registered under the entry-point group `memcheck.stacks` (README,
"Adding a stack"). It must implement `prepare()` and `run()`; every other hook has a default here, and the
harness calls nothing that is not declared in this file.

    check(workload, device)            classmethod: raise StackUnavailable(reason) when this runner cannot run it
    check_attention(name, wl, device)  classmethod, stacks with `attentions`: the same for one implementation
    check_prediction(workload)         classmethod: raise StackUnavailable(reason) where a prediction (fake CUDA
                                       tensors on a CPU runner, memcheck/predict/) cannot run the workload
    worker_python(rootdir)             classmethod: the interpreter of a stack living in its own environment
    installed(rootdir)                 classmethod: False where this runner lacks the stack (its items skip)
    needs_device_alone(rootdir)        classmethod: why its items cannot share a GPU with others (-n), or None
    prepare()                          build the model and cache: inside the collectors, its memory counts
    warmup()                           compile, autotune, capture graphs: timed as time.warmup
    run(collectors) -> RunResult       serve every request; collectors.step(n, **kv) after each engine step
    software()                         what the installed software chose for this item (hf: the attention
                                       transformers picked), fingerprinted and named like a version when it changes
    weights_bytes(), workspace_bytes() for the analytic floors reported beside the peaks
    close()                            drop the model; the harness then collects garbage and stops measuring

Class attributes: `name`, `attentions`, `fork_preload`, `rank_processes`, `warmup_moves_memory`. Helpers a
stack uses to report the metrics every stack reports the same way: `time_metrics` (tokens_per_s, ttft, tpot;
memcheck/stacks/time_metrics.py) and `distinct_pages` (kv.page_footprint; memcheck/stacks/pages.py). Device checks:
`memcheck.devices.is_cuda`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..errors import StackUnavailable
from ..metrics.value import MetricValue


@dataclass
class RunResult:
    """What a stack hands back after running a workload's requests."""

    outputs: list[list[int]]  # generated token ids per request, in the workload's request order
    metrics: dict[str, MetricValue] = field(default_factory=dict)  # kv.* and time metrics the stack measured
    notes: list[str] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


class Stack(ABC):
    """Subclass, register under the entry-point group `memcheck.stacks`, and memcheck runs your engine."""

    name = ""
    # Attention implementations a workload may pin as `stacks: [NAME:IMPL]`, one item each; plain NAME runs the
    # stack's own default. Empty: the stack takes no variant.
    attentions: tuple[str, ...] = ()
    attention: str | None = None  # the implementation this item runs, set by the harness before prepare()
    # Modules the worker's fork server imports once before forking the rounds of this stack (memcheck/forkserver.py):
    # only modules whose import starts no thread and initialises no device.
    fork_preload: tuple[str, ...] = ()
    # True: at `tensor_parallel: N` the harness starts N worker processes, one per rank, and the stack shards
    # its model over the torch.distributed group they join (memcheck/rank_workers.py). False: one worker, and
    # the stack runs its own tensor parallelism (vllm).
    rank_processes: bool = False
    # False: warmup() runs the workload once and only moves time (the hf stack's on a GPU): the harness then traces
    # the Python heap through it (host.heap_alloc.peak), and the run after it, timed, needs no memory round.
    warmup_moves_memory: bool = True

    def __init__(self, workload, device):
        self.workload, self.device = workload, device

    @classmethod
    def worker_python(cls, rootdir: str) -> str | None:
        """The Python interpreter to run this stack's worker with, for a stack that lives in an environment
        of its own (vLLM pins its own torch); None: the harness's own interpreter."""
        return None

    @classmethod
    def installed(cls, rootdir: str) -> bool:
        """False where this runner lacks the stack altogether: its items are then skipped by their worker in a
        second, and hold no GPU meanwhile (memcheck/device_share.py). check() says why, from the worker."""
        return True

    @classmethod
    def needs_device_alone(cls, rootdir: str) -> str | None:
        """Why this stack's items must hold the GPU alone when items are measured at once (memcheck/device_share.py),
        or None: measured per process (the torch allocator, NVML per process), an item's numbers are its own
        beside others. Asked by the runner before the item's worker starts."""
        return None

    @classmethod
    def check(cls, workload, device) -> None:
        """Raise memcheck.errors.StackUnavailable(reason) if this runner cannot run the workload."""

    @classmethod
    def check_attention(cls, attention: str, workload, device) -> None:
        """Raise StackUnavailable(reason) if the pinned attention implementation cannot run on this runner (not
        installed, needs a GPU), SoftwareUnsupported if the installed software does not implement it for this
        model. Called only for items that pin one (`NAME:IMPL`)."""

    @classmethod
    def check_prediction(cls, workload) -> None:
        """Raise StackUnavailable(reason) where the workload cannot be predicted: run on fake CUDA tensors (shapes,
        no values) with its kernels launched as no-ops. A stack qualifies when nothing it decides reads a value
        computed on the device. The default: not shown to run under a prediction."""
        raise StackUnavailable(f"the {cls.name or cls.__name__} stack has not been shown to run under a prediction "
                               "(fake CUDA tensors on a CPU runner)")

    @abstractmethod
    def prepare(self) -> None:
        """Build the model (seeded random weights) and whatever the engine holds before serving."""

    def warmup(self) -> None:
        """Run a little of the workload so one-time JIT compilation, autotuning and CUDA-graph capture land
        outside the timed run. Its memory counts in the peaks (the collectors are on); its time is
        time.warmup, not time.wall. The default does nothing (time.warmup is null)."""

    @classmethod
    def has_warmup(cls) -> bool:
        return cls.warmup is not Stack.warmup

    @abstractmethod
    def run(self, collectors) -> RunResult:
        """Serve every request of the workload. Call `collectors.step(n, **{"kv.bytes": b, "kv.live_bytes": l})`
        after each engine step: the report's timeline and the sampled peaks are read there."""

    def software(self) -> dict[str, str]:
        """What the installed software chose for this item, after prepare(), that a release may change as it
        changes a version (hf: {"attention": "sdpa"}): stored in the item's fingerprint and named beside the
        verdict when it differs from the baseline's ('attention sdpa -> eager')."""
        return {}

    def weights_bytes(self) -> int | None:
        """Bytes of the model's parameters and buffers, for the analytic floor."""
        return None

    def workspace_bytes(self) -> int | None:
        """The activation workspace the engine declares it holds (reported beside the floors); None: not declared."""
        return None

    def close(self) -> None:
        """Drop the model and caches; the harness collects garbage and stops the collectors after it."""
