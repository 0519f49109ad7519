"""The states an item and its checks can be in, as `str` enums: they compare equal to, and are written to JSON
as, the very strings reports and baselines have always held ("regressed", "not_measured", "oom"...)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _State(str, Enum):
    __str__ = str.__str__  # "regressed", not "Verdict.REGRESSED", in messages and f-strings
    __format__ = str.__format__


class Verdict(_State):
    """One item's verdict; declared worst first (the order of every report's summary)."""

    REGRESSED = "regressed"
    ERROR = "error"  # the workload failed (out of memory, crash, timeout, bad input), or no longer runs
    IMPROVED = "improved"  # beyond the threshold in the better direction: refresh the baseline
    INCOMPARABLE = "incomparable"  # baseline from another device class, GPU, profile or workload definition
    NEW = "new"  # no baseline for this device class yet
    PASS = "pass"
    SKIPPED = "skipped"  # the stack cannot run on this runner


class CheckStatus(_State):
    """One rule on one metric."""

    PASS = "pass"
    REGRESSED = "regressed"
    IMPROVED = "improved"
    NEW = "new"
    NOT_MEASURED = "not_measured"  # the metric is null here (its reason says why)
    NOT_COMPARED = "not_compared"  # no baseline value, or too few rounds for a band


class ErrorKind(_State):
    OOM = "oom"
    CRASH = "crash"
    TIMEOUT = "timeout"
    USAGE = "usage"

    @property
    def describe(self) -> str:
        return {"oom": "out of memory", "crash": "crashed", "timeout": "timed out", "usage": "bad input"}[self.value]


@dataclass
class ItemError:
    """Why an item's workload failed; JSON {"kind": ..., "message": ...}."""

    kind: ErrorKind
    message: str

    def __post_init__(self):
        self.kind = ErrorKind(self.kind)

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message}

    @classmethod
    def from_json(cls, data: dict) -> "ItemError":
        return cls(data["kind"], data["message"])
