"""One measured metric: a number, or null with the reason it could not be measured here."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class MetricValue:
    value: float | None
    reason: str | None = None  # why value is null; never set together with a value
    detail: str | None = None  # how it was measured (sampling period, source) when that matters
    samples: list[float] = field(default_factory=list)  # one per round, when rounds > 1
    revision: int = 1  # of the metric's definition it was measured by (catalog.MetricSpec.revision)

    @classmethod
    def null(cls, reason: str) -> "MetricValue":
        return cls(None, reason=reason)

    @classmethod
    def from_rounds(cls, values: list["MetricValue"]) -> "MetricValue":
        """Combine rounds: the median of the measured values; null only if every round was null."""
        measured = [v.value for v in values if v.value is not None]
        if not measured:
            return values[0]
        return cls(statistics.median(measured), detail=values[0].detail, samples=measured)

    def to_json(self) -> dict:
        out: dict = {"value": self.value}
        if self.reason:
            out["reason"] = self.reason
        if self.detail:
            out["detail"] = self.detail
        if len(self.samples) > 1:
            out["samples"] = self.samples
        if self.revision != 1:
            out["revision"] = self.revision
        return out

    @classmethod
    def from_json(cls, data: dict) -> "MetricValue":
        return cls(data.get("value"), data.get("reason"), data.get("detail"), list(data.get("samples", [])),
                   data.get("revision", 1))
