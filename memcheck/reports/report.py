"""The session report: every item's result plus the environment, and the JSON that other tools read.

JSON schema `memcheck.report/1`: {schema, created, profile, environment, summary: {verdict: count},
failed, items: [ItemResult.to_json()]}. `memcheck comment`, `merge` and `compare` read this file.
Items gained optional fields without a schema bump (older reports lack them and stay readable, older
readers ignore them): `compared_across` (software versions judged across), `rules` (the rules judged by,
for `memcheck compare`), `model` (preset or config.json, model_type, config digest).
"""
from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from dataclasses import dataclass, field

from ..errors import UsageError
from ..measurement import Measurement
from ..metrics.value import MetricValue
from ..timeline import is_timeline
from .. import rules
from ..rules import Check
from ..states import CheckStatus, Verdict
from ..verdict import ItemResult

SCHEMA = "memcheck.report/1"
ORDER = tuple(Verdict)  # worst first: the summary's order


@dataclass
class Report:
    items: list[ItemResult] = field(default_factory=list)
    profile: str | None = None
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
                         .isoformat(timespec="seconds"))

    @property
    def summary(self) -> dict[str, int]:
        counts = Counter(r.verdict for r in self.items)
        return {v: counts[v] for v in ORDER if counts[v]}

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.items)

    @property
    def gpu_seconds(self) -> tuple[float, float, int] | None:
        """(GPU seconds of every item, seconds the items held a GPU, items measured on one) or None without a GPU."""
        held = [r.measurement for r in self.items if r.measurement.gpu_seconds is not None]
        if not held:
            return None
        return (sum(m.gpu_seconds for m in held), sum(m.gpu_held_seconds or 0.0 for m in held), len(held))

    @property
    def environment(self) -> dict:
        envs = self.environments
        return envs[0] if envs else {}

    @property
    def environments(self) -> list[dict]:
        """One environment per device class that ran (a merged report may hold a CPU and a GPU job)."""
        seen: dict[str, dict] = {}
        for r in self.items:
            env = r.measurement.environment
            if env:
                seen.setdefault(env.get("device_class") or "", env)
        return list(seen.values())

    def workloads(self) -> dict[str, list[ItemResult]]:
        """Items grouped by workload, in report order: every stack that ran the workload."""
        out: dict[str, list[ItemResult]] = {}
        for r in self.items:
            out.setdefault(r.measurement.workload, []).append(r)
        return out

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "profile": self.profile,
                "environment": self.environment, "summary": self.summary, "failed": self.failed,
                "items": [r.to_json() for r in self.items]}

    @classmethod
    def from_json(cls, data: dict, source: str = "report") -> "Report":
        """Rebuild a report from its JSON (the inverse of to_json), checking the schema first."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise UsageError(f"not a memcheck report: schema is {found!r}, expected {SCHEMA!r}", source)
        try:
            items = [_item_from_json(item) for item in data.get("items", [])]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"malformed item in memcheck report: {e}", source) from None
        return cls(items=items, profile=data.get("profile"), created=data.get("created") or cls().created)

    @classmethod
    def load(cls, path: str) -> "Report":
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as e:
            raise UsageError(f"cannot read the report: {e.strerror}", path) from None
        except json.JSONDecodeError as e:
            raise UsageError(f"not JSON: {e.msg}", path, e.lineno) from None
        return cls.from_json(data, path)

    def write_json(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.to_json(), f, indent=1)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


_MEASUREMENT_FIELDS = ("workload", "stack", "file", "profile", "scaled", "digest", "metrics", "floors", "environment",
                       "timeline", "artifacts", "notes", "error", "skipped", "rounds", "ranks", "model",
                       "phases", "gpu_seconds", "gpu_held_seconds")


def _number(value, what: str):
    """A report may come from untrusted code (a fork's CI run): every number must be a number."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{what} is {type(value).__name__}, not a number")
    return value


def _validate(data: dict) -> None:
    if data.get("verdict") not in ORDER:
        raise ValueError(f"unknown verdict {str(data.get('verdict'))[:40]!r}")
    for name, metric in (data.get("metrics") or {}).items():
        _number(metric.get("value") if isinstance(metric, dict) else metric, f"metric {name[:40]!r}")
        for sample in (metric.get("samples") or []) if isinstance(metric, dict) else ():
            _number(sample, f"a sample of {name[:40]!r}")
    for name, value in (data.get("floors") or {}).items():
        _number(value, f"floor {str(name)[:40]!r}")
    _number(data.get("gpu_seconds"), "gpu_seconds")
    _number(data.get("gpu_held_seconds"), "gpu_held_seconds")
    for c in data.get("checks") or []:
        if c.get("status") not in tuple(CheckStatus):
            raise ValueError(f"unknown check status {str(c.get('status'))[:40]!r}")
        _number(c.get("value"), "a check's value")
        _number(c.get("baseline"), "a check's baseline")
    ranks = data.get("ranks") or []  # tensor parallel: each rank's numbers
    if not isinstance(ranks, list):
        raise ValueError("ranks is not a list")
    for i, rank in enumerate(ranks):
        if not isinstance(rank, dict) or not isinstance(rank.get("rank"), int) \
                or not isinstance(rank.get("metrics"), dict):
            raise ValueError(f"ranks[{i}] is not a mapping of an integer rank and its metrics")
        for name, value in rank["metrics"].items():
            _number(value, f"rank metric {str(name)[:40]!r}")
    if not isinstance(data.get("reason") or "", str):  # the reports group skipped items by it
        raise ValueError("reason is not a string")
    for key in ("environment", "artifacts", "model"):
        if not isinstance(data.get(key) or {}, dict):
            raise ValueError(f"{key} is not a mapping")
    for key in ("incomparable_fields", "compared_across"):
        if not isinstance(data.get(key) or [], list) or not all(isinstance(s, str) for s in data.get(key) or []):
            raise ValueError(f"{key} is not a list of strings")


def _item_from_json(data: dict) -> ItemResult:
    _validate(data)
    m = Measurement.from_json({k: data[k] for k in _MEASUREMENT_FIELDS if k in data})
    checks = [Check(c["metric"], c["status"], c.get("value"), c.get("baseline"), c.get("rule", ""),
                    c.get("message", "")) for c in data.get("checks", [])]
    base = data.get("baseline") or {}
    result = ItemResult(m, data["verdict"], data.get("reason", ""), checks, base.get("path"), base.get("recorded"),
                        list(data.get("incomparable_fields", [])),
                        {k: MetricValue.from_json(v) for k, v in (base.get("metrics") or {}).items()},
                        data.get("baseline_updated"))
    # Both absent from reports of earlier memcheck versions, which stay readable.
    result.compared_across = list(data.get("compared_across") or [])
    result.baseline_timeline = base.get("timeline") if is_timeline(base.get("timeline")) else []
    result.baseline_environment = base.get("environment") if isinstance(base.get("environment"), dict) else {}
    result.rule_set = {name: rules.from_json(name, raw) for name, raw in (data.get("rules") or {}).items()}
    # `failed` is derived; a report written with --memcheck-strict keeps its failing `new` items failing.
    result.strict = bool(data.get("failed")) and result.verdict == "new"
    return result


def merge(reports: list[Report]) -> tuple[Report, list[str]]:
    """One report from several (parallel CI jobs, xdist workers). An item measured twice keeps the report
    created last; the second value lists what was replaced, for the caller to print."""
    reports = sorted(reports, key=lambda r: r.created)
    by_id: dict[str, ItemResult] = {}
    replaced: list[str] = []
    for report in reports:
        for item in report.items:
            key = f"{item.measurement.environment.get('device_class', '')}/{item.id}"
            if key in by_id:
                replaced.append(f"{item.id} ({item.measurement.environment.get('device_class', '?')}): "
                                f"kept the result of the report created {report.created}")
            by_id[key] = item
    profiles = sorted({r.profile for r in reports if r.profile})
    merged = Report(items=list(by_id.values()), profile=", ".join(profiles) or None)
    return merged, replaced
