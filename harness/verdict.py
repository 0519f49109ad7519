"""From a measurement, its baseline and its rules to one verdict per item.

pass | regressed | improved (beyond the band: refresh the baseline) | new (no baseline) |
incomparable (baseline from another device class or software) | error (the workload failed) |
skipped (the stack cannot run on this runner).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import environment, rules
from .baselines import Baseline
from .measurement import Measurement
from .metrics.catalog import reported_by
from .metrics.value import MetricValue

FAILING = ("regressed", "error")


@dataclass
class ItemResult:
    measurement: Measurement
    verdict: str
    reason: str = ""
    checks: list[rules.Check] = field(default_factory=list)
    baseline_path: str | None = None
    baseline_recorded: str | None = None
    differences: list[str] = field(default_factory=list)  # why incomparable
    baseline_metrics: dict[str, MetricValue] = field(default_factory=dict)
    updated: list[str] | None = None  # changes applied when this run refreshed the baseline
    strict: bool = False  # --memcheck-strict: a `new` item fails too

    @property
    def id(self) -> str:
        return self.measurement.id

    @property
    def failed(self) -> bool:
        if self.updated is not None:  # a refresh accepted this run's numbers as the new baseline
            return self.verdict == "error"
        return self.verdict in FAILING or (self.strict and self.verdict == "new")

    def to_json(self) -> dict:
        m = self.measurement.to_json()
        return {
            "id": self.id, "verdict": self.verdict, "reason": self.reason, **m,
            "checks": [c.to_json() for c in self.checks],
            "baseline": None if self.baseline_path is None else {
                "path": self.baseline_path, "recorded": self.baseline_recorded,
                "metrics": {k: v.to_json() for k, v in self.baseline_metrics.items()}},
            "incomparable_fields": self.differences, "failed": self.failed, "baseline_updated": self.updated,
        }


def judge(m: Measurement, rule_set: dict[str, rules.Rule], baseline: Baseline | None,
          baseline_error: str | None = None) -> ItemResult:
    if m.skipped:
        return ItemResult(m, "skipped", m.skipped)
    if m.error:
        kind = {"oom": "out of memory", "crash": "crashed", "timeout": "timed out", "usage": "bad input"}
        return ItemResult(m, "error", f"{kind.get(m.error['kind'], m.error['kind'])}: {m.error['message']}")
    if baseline_error:
        return ItemResult(m, "error", baseline_error)
    result = ItemResult(m, "pass")
    comparable = baseline
    if baseline is not None:
        result.baseline_path, result.baseline_recorded = str(baseline.path), baseline.recorded
        result.baseline_metrics = baseline.metrics
        result.differences = environment.differences(baseline.environment, m.environment, m.stack)
        if result.differences:
            comparable = None  # ceilings still hold; relative rules have nothing fair to compare with
    for metric, rule in sorted(rule_set.items()):
        if metric not in m.metrics and not reported_by(metric, m.stack):
            continue  # another stack's metric (vllm.*): not a gap in this item
        now = m.metrics.get(metric, MetricValue.null("not reported"))
        base = comparable.metrics.get(metric) if comparable else None
        result.checks.append(rules.evaluate(rule, now, base))
    regressed = [c for c in result.checks if c.status == "regressed"]
    improved = [c for c in result.checks if c.status == "improved"]
    if regressed:
        result.verdict = "regressed"
        result.reason = " ".join(f"{c.metric} regressed: {c.message}." for c in regressed)
    elif baseline is None:
        result.verdict, result.reason = "new", "no baseline for this device class yet"
    elif result.differences:
        result.verdict = "incomparable"
        result.reason = "baseline recorded under a different environment: " + "; ".join(result.differences)
    elif improved:
        result.verdict = "improved"
        result.reason = " ".join(f"{c.metric} improved: {c.message}." for c in improved) + " Refresh the baseline."
    return result
