"""Threshold rules: parsed from pyproject/workload YAML, evaluated per metric into a Check.

Forms (one mapping per metric):
  max_increase: 2%              relative to the baseline
  max_increase: 64MiB           absolute (sizes for byte metrics, plain numbers otherwise)
  max_increase: 2% and 64MiB    both must be exceeded to regress (noise floor for small values)
  max: 0.05 / min: 100          a maximum and a minimum, checked with or without a baseline
  direction: lower_is_worse     for throughput-like metrics (default from the metric catalog)
  band: 3                       noisy metrics: beyond 3 standard deviations of the repeated rounds
A change in the better direction beyond the same threshold is 'improved' (refresh the baseline).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from . import units
from .metrics.catalog import METRICS
from .metrics.value import MetricValue
from .states import CheckStatus

KEYS = {"max_increase", "max", "min", "direction", "band"}
DIRECTIONS = ("higher_is_worse", "lower_is_worse")
MIN_ROUNDS_FOR_BAND = 3


@dataclass(frozen=True)
class Rule:
    metric: str
    relative: float | None = None  # fraction, from '2%'
    absolute: float | None = None  # metric units, from '64MiB' or a number
    maximum: float | None = None  # `max:` (stored in reports as "ceiling")
    minimum: float | None = None  # `min:` (stored in reports as "floor"; not memcheck/floors.py's analytic floors)
    lower_is_worse: bool = False
    band: float | None = None
    text: str = ""

    @property
    def compares_baseline(self) -> bool:
        return self.relative is not None or self.absolute is not None or self.band is not None


@dataclass
class Check:
    metric: str
    status: CheckStatus
    value: float | None
    baseline: float | None
    rule: str
    message: str = ""

    def __post_init__(self):
        self.status = CheckStatus(self.status)

    @property
    def delta(self) -> float | None:
        if self.value is None or self.baseline is None:
            return None
        return self.value - self.baseline

    @property
    def delta_rel(self) -> float | None:
        d = self.delta
        if d is None:
            return None
        if self.baseline == 0:
            return 0.0 if d == 0 else math.copysign(math.inf, d)
        return d / abs(self.baseline)

    def to_json(self) -> dict:
        rel = self.delta_rel
        return {
            "metric": self.metric, "status": self.status, "value": self.value, "baseline": self.baseline,
            "delta": self.delta, "delta_rel": None if rel is None or math.isinf(rel) else rel,
            "rule": self.rule, "message": self.message,
        }


# Rule attribute -> its key in the reports' JSON (the keys are a stable format).
RULE_FIELDS = {"relative": "relative", "absolute": "absolute", "maximum": "ceiling", "minimum": "floor",
               "band": "band"}


def to_json(rule: Rule) -> dict:
    """A rule as stored in reports: its parsed numbers, so another tool judges by exactly this rule."""
    return {**{key: getattr(rule, attr) for attr, key in RULE_FIELDS.items()}, "lower_is_worse": rule.lower_is_worse,
            "text": rule.text}


def from_json(metric: str, data: dict) -> Rule:
    """The inverse of to_json. Raises ValueError on anything but numbers where numbers belong."""
    if metric not in METRICS or not isinstance(data, dict):
        raise ValueError(f"rule of unknown metric {str(metric)[:40]!r}")
    for key in RULE_FIELDS.values():
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"rule {metric}.{key} is {type(value).__name__}, not a number")
    return Rule(metric, **{attr: data.get(key) for attr, key in RULE_FIELDS.items()},
                lower_is_worse=bool(data.get("lower_is_worse")), text=str(data.get("text", "")))


def parse(metric: str, raw, where) -> Rule | None:
    """Parse one metric's rule. `where(field, message)` builds the UsageError naming file, line and field.
    Returns None when the rule is switched off (`off` / `false`)."""
    if metric not in METRICS:
        raise where(metric, f"unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}")
    if raw in (False, "off", None):
        return None
    if not isinstance(raw, dict) or not raw:
        raise where(metric, "a rule is a mapping such as {max_increase: 2%} or {max: 0.05}")
    unknown = set(raw) - KEYS
    if unknown:
        raise where(f"{metric}.{sorted(unknown)[0]}", f"unknown rule key; known: {', '.join(sorted(KEYS))}")
    unit = METRICS[metric].unit
    fields: dict = {"lower_is_worse": METRICS[metric].lower_is_worse}
    parsers = {
        "max_increase": lambda v: _parse_increase(v, unit),
        "max": lambda v: {"maximum": _parse_amount(v, unit)},
        "min": lambda v: {"minimum": _parse_amount(v, unit)},
        "band": lambda v: {"band": _parse_band(v)},
    }
    for key, parser in parsers.items():
        if key in raw:
            try:
                fields.update(parser(raw[key]))
            except ValueError as e:
                raise where(f"{metric}.{key}", str(e)) from None
    if "direction" in raw:
        if raw["direction"] not in DIRECTIONS:
            raise where(f"{metric}.direction", f"must be one of {', '.join(DIRECTIONS)}, got {raw['direction']!r}")
        fields["lower_is_worse"] = raw["direction"] == "lower_is_worse"
    text = ", ".join(f"{k} {v}" for k, v in raw.items())
    return Rule(metric, text=text, **fields)


def merge(base: dict[str, Rule], raw, where) -> dict[str, Rule]:
    """The one place rules are layered: built-in defaults < the project's [tool.memcheck] < the workload's
    `thresholds:` < a `memcheck` marker's or fixture's `thresholds=`. `raw` (metric -> rule, `off` drops the
    metric's rule) overrides `base`; `where(field, message)` names the field in the file being read ('' is the
    mapping itself)."""
    if not isinstance(raw, dict):
        raise where("", "must be a mapping of metric name to rule")
    merged = dict(base)
    for metric, rule_raw in raw.items():
        rule = parse(metric, rule_raw, where)
        if rule is None:
            merged.pop(metric, None)
        else:
            merged[metric] = rule
    return merged


def _parse_increase(raw, unit: str) -> dict:
    parts = [p.strip() for p in raw.split(" and ")] if isinstance(raw, str) else [raw]
    if len(parts) > 2:
        raise ValueError(f"{raw!r}: at most one relative and one absolute part ('2% and 64MiB')")
    out: dict = {}
    for part in parts:
        key = "relative" if units.is_percent(part) else "absolute"
        if key in out:
            raise ValueError(f"{raw!r}: give one relative and one absolute part ('2% and 64MiB')")
        out[key] = units.parse_percent(part) if key == "relative" else _parse_amount(part, unit, percent_too=True)
        if out[key] < 0:
            raise ValueError(f"{raw!r}: a threshold cannot be negative")
    return out


def _parse_band(raw) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw <= 0:
        raise ValueError(f"band must be a positive number of standard deviations, got {raw!r}")
    return float(raw)


def _parse_amount(raw, unit: str, percent_too: bool = False) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"{raw!r} is not a number or a size")
    if unit == "bytes" and _is_number(raw):  # `max_increase: 25` meant 25% as often as 25 bytes: say which
        number = str(raw).strip()
        either = f"{number}% or " if percent_too else ""
        raise ValueError(f"{number} on a bytes metric needs its unit: write {either}{number}B (KiB, MiB, GiB)")
    if isinstance(raw, (int, float)):
        return float(raw)
    if unit == "bytes" and units.is_size(raw):
        return float(units.parse_size(raw))
    if unit == "ratio" and units.is_percent(raw):
        return units.parse_percent(raw)
    try:  # a plain number inside a string, as in "10% and 8"
        return float(raw)
    except (TypeError, ValueError):
        pass
    kind = {"bytes": "a percentage (2%) or a size (64MiB)", "ratio": "a percentage (2%) or a number"}
    raise ValueError(f"{raw!r} is not {kind.get(unit, 'a percentage (2%) or a number')}")


def _is_number(raw) -> bool:
    try:
        float(raw)
        return True
    except (TypeError, ValueError):
        return False


def evaluate(rule: Rule, now: MetricValue, base: MetricValue | None) -> Check:
    """Compare one metric against its rule (and its baseline when there is one)."""
    unit = METRICS[rule.metric].unit
    fmt = lambda v: units.format_value(v, unit)  # noqa: E731
    base_value = base.value if base is not None else None
    check = Check(rule.metric, CheckStatus.PASS, now.value, base_value, rule.text)
    if now.value is None:
        check.status, check.message = CheckStatus.NOT_MEASURED, f"not measured here: {now.reason}"
        return check
    # `max:` and `min:` hold with or without a baseline.
    if rule.maximum is not None and now.value > rule.maximum:
        check.status = CheckStatus.REGRESSED
        check.message = f"{fmt(now.value)} is above the ceiling {fmt(rule.maximum)}"
        return check
    if rule.minimum is not None and now.value < rule.minimum:
        check.status = CheckStatus.REGRESSED
        check.message = f"{fmt(now.value)} is below the minimum {fmt(rule.minimum)}"
        return check
    if not rule.compares_baseline:
        return check
    spec = METRICS[rule.metric]
    if base is not None and base_value is not None and base.revision != spec.revision:
        check.status = CheckStatus.NOT_COMPARED
        check.message = (f"the baseline measured it by revision {base.revision} of its definition, this run by "
                         f"revision {spec.revision} ({spec.revised}); refresh the baseline")
        return check
    if base is None or base_value is None:
        check.status = CheckStatus.NEW
        check.message = "no baseline value" if base is None else f"baseline has no value ({base.reason})"
        return check
    if METRICS[rule.metric].noisy or rule.band is not None:
        return _evaluate_band(rule, now, base, check, fmt)
    worse = check.delta if not rule.lower_is_worse else -check.delta
    if _beyond(rule, worse, base_value):
        check.status = CheckStatus.REGRESSED
    elif _beyond(rule, -worse, base_value):
        check.status = CheckStatus.IMPROVED
    check.message = _describe(check, fmt)
    return check


def _beyond(rule: Rule, worse_by: float, base_value: float) -> bool:
    """True if a change `worse_by` (positive = worse) exceeds every part the rule gives."""
    parts = []
    if rule.relative is not None:
        parts.append(worse_by > rule.relative * abs(base_value) if base_value else worse_by > 0)
    if rule.absolute is not None:
        parts.append(worse_by > rule.absolute)
    return bool(parts) and all(parts)


def _evaluate_band(rule: Rule, now: MetricValue, base: MetricValue, check: Check, fmt) -> Check:
    rounds = min(len(now.samples), len(base.samples))
    if rounds < MIN_ROUNDS_FOR_BAND:
        check.status = CheckStatus.NOT_COMPARED
        check.message = (f"noisy metric: compared only through repeated rounds (rounds >= {MIN_ROUNDS_FOR_BAND}); "
                         f"this run has {max(len(now.samples), 1)}, the baseline {max(len(base.samples), 1)}")
        return check
    k = rule.band or 3.0
    spread = max(statistics.stdev(now.samples), statistics.stdev(base.samples))
    worse = check.delta if not rule.lower_is_worse else -check.delta
    band = k * spread
    if rule.relative is not None:  # a relative part widens the band: never flag a change smaller than it
        band = max(band, rule.relative * abs(base.value))
    if worse > band:
        check.status = CheckStatus.REGRESSED
    elif -worse > band:
        check.status = CheckStatus.IMPROVED
    check.message = _describe(check, fmt) + f" (band ±{fmt(band)} from {rounds} rounds)"
    return check


def _describe(check: Check, fmt) -> str:
    delta = check.delta
    rel = units.format_percent(check.delta_rel)
    sign = "+" if delta > 0 else "-" if delta < 0 else "±"
    return f"baseline {fmt(check.baseline)}, now {fmt(check.value)}, {sign}{fmt(abs(delta))} ({rel}), rule {check.rule}"
