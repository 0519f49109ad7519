"""From a measurement, its baseline and its rules to one verdict per item (the verdicts: memcheck/states.py).
`runner.judge_item` wraps it with the baseline lookup and write, for workload items and code blocks alike.

A baseline recorded under other software versions (torch, transformers, vLLM, ...) is judged as usual;
`compared_across` names those versions and every report shows it beside the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import environment, rules
from .baselines import Baseline
from .measurement import Measurement
from .metrics.catalog import reported_by
from .metrics.value import MetricValue
from .states import CheckStatus, Verdict

FAILING = (Verdict.REGRESSED, Verdict.ERROR)


@dataclass
class ItemResult:
    measurement: Measurement
    verdict: Verdict
    reason: str = ""
    checks: list[rules.Check] = field(default_factory=list)
    baseline_path: str | None = None
    baseline_recorded: str | None = None
    differences: list[str] = field(default_factory=list)  # why incomparable
    baseline_metrics: dict[str, MetricValue] = field(default_factory=dict)
    updated: list[str] | None = None  # changes applied when this run refreshed the baseline
    strict: bool = False  # --memcheck-strict: a `new` item fails too
    compared_across: list[str] = field(default_factory=list)  # software versions judged across: 'torch 2.12 -> 2.13'
    rule_set: dict[str, rules.Rule] = field(default_factory=dict)  # judged by these (`memcheck compare` reuses them)
    baseline_timeline: list[dict] = field(default_factory=list)  # the baseline's memory over its steps, downsampled
    baseline_environment: dict = field(default_factory=dict)  # what the baseline ran under, to label its curve

    def __post_init__(self):
        self.verdict = Verdict(self.verdict)

    @property
    def id(self) -> str:
        return self.measurement.id

    @property
    def failed(self) -> bool:
        """The one place that decides whether an item fails the run (pytest, `memcheck`, reports, exit codes)."""
        if self.updated is not None:  # a refresh accepted this run's numbers as the new baseline
            return self.verdict == Verdict.ERROR
        return self.verdict in FAILING or (self.strict and self.verdict == Verdict.NEW)

    def to_json(self) -> dict:
        m = self.measurement.to_json()
        return {
            "id": self.id, "verdict": self.verdict, "reason": self.reason, **m,
            "checks": [c.to_json() for c in self.checks],
            "baseline": None if self.baseline_path is None else {
                "path": self.baseline_path, "recorded": self.baseline_recorded,
                "metrics": {k: v.to_json() for k, v in self.baseline_metrics.items()},
                "timeline": self.baseline_timeline, "environment": self.baseline_environment},
            "incomparable_fields": self.differences, "compared_across": self.compared_across,
            "failed": self.failed, "baseline_updated": self.updated,
            "rules": {name: rules.to_json(rule) for name, rule in sorted(self.rule_set.items())},
        }

    @property
    def across(self) -> str:
        """'after transformers 5.16.0 -> 5.17.0', or '' when the baseline ran the same software."""
        return "after " + ", ".join(self.compared_across) if self.compared_across else ""


def judge(m: Measurement, rule_set: dict[str, rules.Rule], baseline: Baseline | None,
          baseline_error: str | None = None, strict_environment=()) -> ItemResult:
    """`strict_environment`: software fields the project makes incomparable ([tool.memcheck])."""
    if m.skipped and m.software_changed and baseline is not None:
        return _no_longer_runs(m, baseline, strict_environment)
    if m.skipped:
        return ItemResult(m, Verdict.SKIPPED, m.skipped)
    if m.error:
        return ItemResult(m, Verdict.ERROR, f"{m.error.kind.describe}: {m.error.message}")
    if baseline_error:
        return ItemResult(m, Verdict.ERROR, baseline_error)
    result = ItemResult(m, Verdict.PASS, rule_set=dict(rule_set))
    comparable = baseline
    if baseline is not None:
        result.baseline_path, result.baseline_recorded = str(baseline.path), baseline.recorded
        result.baseline_metrics = baseline.metrics
        result.baseline_timeline, result.baseline_environment = baseline.timeline, baseline.environment
        result.differences = environment.differences(baseline.environment, m.environment, m.stack,
                                                     strict_environment)
        owner = baseline.environment.get("test")
        if owner and m.environment.get("test") and owner != m.environment["test"]:
            return ItemResult(m, Verdict.ERROR, f"the baseline {baseline.path} belongs to the test {owner}, not "
                                                f"{m.environment['test']}: name one block apart (memcheck(name=...))",
                              baseline_path=str(baseline.path))
        if result.differences:
            comparable = None  # ceilings still hold; relative rules have nothing fair to compare with
        else:
            result.compared_across = environment.software_changes(baseline.environment, m.environment, m.stack,
                                                                   strict_environment)
    for metric, rule in sorted(rule_set.items()):
        if metric not in m.metrics and not reported_by(metric, m.stack):
            continue  # another stack's metric (vllm.*): not a gap in this item
        now = m.metrics.get(metric, MetricValue.null("not reported"))
        base = comparable.metrics.get(metric) if comparable else None
        result.checks.append(rules.evaluate(rule, now, base))
    regressed = [c for c in result.checks if c.status == CheckStatus.REGRESSED]
    improved = [c for c in result.checks if c.status == CheckStatus.IMPROVED]
    if regressed:
        result.verdict = Verdict.REGRESSED
        after = f" {result.across}" if result.across else ""
        result.reason = " ".join(f"{c.metric} regressed: {c.message}{after}." for c in regressed)
    elif baseline is None:
        result.verdict, result.reason = Verdict.NEW, ("no baseline for this device class yet: record it with "
                                                       "`memcheck baseline refresh` (or --memcheck-update-baselines)")
    elif result.differences:
        result.verdict = Verdict.INCOMPARABLE
        result.reason = "baseline recorded under a different environment: " + "; ".join(result.differences)
    elif improved:
        result.verdict = Verdict.IMPROVED
        after = f" {result.across}" if result.across else ""
        result.reason = " ".join(f"{c.metric} improved: {c.message}{after}." for c in improved)
        result.reason += " Refresh the baseline."
    return result


def _no_longer_runs(m: Measurement, baseline: Baseline, strict_environment) -> ItemResult:
    """An item whose baseline ran, and that the installed software can no longer run: a skip would hide the bump."""
    result = ItemResult(m, Verdict.ERROR, baseline_path=str(baseline.path), baseline_recorded=baseline.recorded,
                        baseline_metrics=baseline.metrics)
    result.compared_across = environment.software_changes(baseline.environment, m.environment, m.stack,
                                                           strict_environment)
    before = (f"its baseline ran before {', '.join(result.compared_across)}" if result.compared_across
              else "its baseline ran under the same versions")
    result.reason = f"no longer runs: {m.skipped}; {before}"
    return result
