"""A Measurement: everything one (workload, stack) run produced. Plain data, JSON round-trip."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import StackUnavailable
from .metrics.value import MetricValue
from .states import ItemError


@dataclass
class Measurement:
    workload: str
    stack: str
    file: str = ""
    profile: str | None = None
    scaled: bool = False
    digest: str = ""
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)  # analytic, labelled as floors in every report
    environment: dict = field(default_factory=dict)
    timeline: list[dict] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: ItemError | None = None  # the workload failed: kind (oom, crash, timeout, usage) and message
    skipped: str | None = None  # the stack cannot run on this runner: why
    # The skip's cause is the installed software (SoftwareUnsupported), not this runner: with a baseline it fails.
    software_changed: bool = False
    rounds: int = 1
    ranks: list[dict] = field(default_factory=list)  # tensor parallel: [{rank, metrics: {name: value}}]
    model: dict = field(default_factory=dict)  # {preset | config, model_type, config_digest}: Preset.identity
    # Where the item's time went, in seconds: startup (process start, imports), build (the stack's prepare),
    # run, teardown (close, collectors), exit (result written, process exit), report (baseline, rules, verdict).
    # Not a metric.
    phases: dict[str, float] = field(default_factory=dict)
    # What the item cost a GPU runner (memcheck/device_share.py): its share of the GPU's time, each moment split
    # evenly among the items holding the GPU then, and the seconds it held the GPU at all. None off a GPU.
    gpu_seconds: float | None = None
    gpu_held_seconds: float | None = None

    def __post_init__(self):
        if isinstance(self.error, dict):  # read from JSON (a worker's result, a report)
            self.error = ItemError.from_json(self.error)

    @classmethod
    def of_item(cls, workload, stack: str) -> "Measurement":
        """An empty measurement of one (workload, stack) item, named and digested as every other of that item."""
        from .stacks import split

        return cls(workload.name, stack, workload.path, workload.profile, workload.scaled,
                   workload.digest(split(stack)[1]))

    @property
    def id(self) -> str:
        return f"{self.workload}[{self.stack}]"

    def skip(self, why: StackUnavailable) -> None:
        """Skipped for a StackUnavailable (or SoftwareUnsupported) reason."""
        self.skipped = str(why)
        self.software_changed = why.software_changed

    def to_json(self) -> dict:
        return {
            "workload": self.workload, "stack": self.stack, "file": self.file, "profile": self.profile,
            "scaled": self.scaled, "digest": self.digest,
            "metrics": {k: v.to_json() for k, v in sorted(self.metrics.items())},
            "floors": self.floors, "environment": self.environment, "timeline": self.timeline,
            "artifacts": self.artifacts, "notes": self.notes, "error": self.error and self.error.to_json(),
            "skipped": self.skipped,
            **({"software_changed": True} if self.software_changed else {}),
            "rounds": self.rounds,
            **({"ranks": self.ranks} if self.ranks else {}),  # absent at tensor_parallel 1
            **({"model": self.model} if self.model else {}),
            **({"phases": self.phases} if self.phases else {}),
            **({"gpu_seconds": self.gpu_seconds, "gpu_held_seconds": self.gpu_held_seconds}
               if self.gpu_seconds is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> "Measurement":
        data = dict(data)
        data["metrics"] = {k: MetricValue.from_json(v) for k, v in data.get("metrics", {}).items()}
        return cls(**data)
