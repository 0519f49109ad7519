"""The stack interface: what a serving engine must do to run under memcheck's workloads."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics.value import MetricValue


@dataclass
class RunResult:
    """What a stack hands back after running a workload's requests."""

    outputs: list[list[int]]  # generated token ids per request, in the workload's request order
    metrics: dict[str, MetricValue] = field(default_factory=dict)  # kv.* and timing metrics the stack knows
    notes: list[str] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


class Stack:
    """Subclass, register under the entry-point group `memcheck.stacks`, and memcheck runs your engine.

    The harness calls, inside its collectors: `prepare()` (build the model: its memory counts),
    `warmup()` (timed as time.warmup, outside the timed run), then `run(probe)` (serve every request;
    call `probe.step(n, **kv)` after each decode step), then `close()`. A stack that cannot run here
    raises StackUnavailable from `check()`.
    """

    name = ""
    # Attention implementations a workload may pick as `stacks: [NAME:IMPL]`, one item each; the first is
    # what plain NAME runs. Empty: the stack takes no variant.
    attentions: tuple[str, ...] = ()
    attention: str | None = None  # the implementation this item runs, set by the harness before prepare()
    # Modules the worker's fork server imports once before forking the rounds of this stack (harness/forkserver.py):
    # only modules whose import starts no thread and initialises no device.
    fork_preload: tuple[str, ...] = ()

    def __init__(self, workload, device):
        self.workload, self.device = workload, device

    @classmethod
    def worker_python(cls, rootdir: str) -> str | None:
        """The Python interpreter to run this stack's worker with, for a stack that lives in an environment
        of its own (vLLM pins its own torch); None: the harness's own interpreter."""
        return None

    @classmethod
    def check(cls, workload, device) -> None:
        """Raise harness.errors.StackUnavailable(reason) if this runner cannot run the workload."""

    @classmethod
    def check_attention(cls, attention: str, workload, device) -> None:
        """Raise StackUnavailable(reason) if the attention implementation cannot run here (not installed, needs
        a GPU, not implemented for this model). Called only for stacks that declare `attentions`."""

    def prepare(self) -> None:
        raise NotImplementedError

    def warmup(self) -> None:
        """Run a little of the workload so one-time JIT compilation, autotuning and CUDA-graph capture land
        outside the timed run. Its memory counts in the peaks (the collectors are on); its time is
        time.warmup, not time.wall. The default does nothing (time.warmup is null)."""

    def run(self, probe) -> RunResult:
        raise NotImplementedError

    def weights_bytes(self) -> int | None:
        """Bytes of the model's parameters and buffers, for the analytic floor."""
        return None

    def close(self) -> None:
        pass
