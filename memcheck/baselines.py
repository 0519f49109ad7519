"""The baseline store: one JSON file per (device class, workload, stack), written atomically.

A file that cannot be read as a memcheck baseline for the item it is named after is an error that
names it; it is never silently replaced.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import environment, units
from .units import is_number
from .errors import UsageError
from .measurement import Measurement
from .metrics.catalog import METRICS
from .metrics.value import MetricValue
from .timeline import downsample, is_timeline

SCHEMA = "memcheck.baseline/1"


@dataclass
class Baseline:
    path: Path
    metrics: dict[str, MetricValue]
    environment: dict
    recorded: str
    rounds: int = 1
    timeline: list[dict] = field(default_factory=list)  # downsampled (timeline.py); absent from older baselines


# What a user can do about a baseline that cannot be read; a gate never overwrites it.
MENDING = "fix or delete it, or refresh the baselines to replace it"


class BaselineStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, device_class: str, workload: str, stack: str) -> Path:
        # An attention variant's file is `hf+flash_attention_2.json`: a ':' is refused by CI artifact uploads
        # and by Windows checkouts.
        return self.root / device_class / workload / f"{stack.replace(':', '+')}.json"

    def load(self, device_class: str, workload: str, stack: str) -> Baseline | None:
        path = self.path(device_class, workload, stack)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"corrupt baseline ({e}); {MENDING}",
                             str(path)) from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise UsageError(f"not a memcheck baseline (schema is not {SCHEMA!r})", str(path))
        if data.get("workload") != workload or data.get("stack") != stack:
            raise UsageError(f"baseline of {data.get('workload')}[{data.get('stack')}] stored under "
                             f"{workload}[{stack}]'s name", str(path))
        problem = shape_problem(data)
        if problem:
            raise UsageError(f"malformed baseline: {problem}; {MENDING}",
                             str(path))
        metrics = {k: MetricValue.from_json(v) for k, v in data["metrics"].items()}
        return Baseline(path, metrics, data["environment"], data.get("recorded", ""), data.get("rounds", 1),
                        data.get("timeline", []))

    def write(self, m: Measurement, replace_unreadable: bool = False) -> tuple[Path, list[str]]:
        """Write m as the baseline of its item; returns the path and the changes applied, one line each. An
        unreadable baseline raises UsageError unless replace_unreadable (the caller has said so to the user)."""
        device_class = m.environment["device_class"]
        path = self.path(device_class, m.workload, m.stack)
        old = None if replace_unreadable else self.load(device_class, m.workload, m.stack)
        data = {
            "schema": SCHEMA, "workload": m.workload, "stack": m.stack, "profile": m.profile,
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rounds": m.rounds, "environment": m.environment,
            "metrics": {k: _stamped(k, v) for k, v in sorted(m.metrics.items())},
            "floors": m.floors, "timeline": downsample(m.timeline),
            **({"ranks": m.ranks} if m.ranks else {}),  # tensor parallel: each rank's numbers, kept for reading
        }
        _atomic_write(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
        return path, _changes(old, m)


def shape_problem(data: dict) -> str | None:
    """What is of the wrong type in a baseline, at any depth the judging reads ('metrics.kv.bytes.peak.value: "lots"
    is not a number'), or None: a number where a number belongs, a mapping where a mapping belongs."""
    if not isinstance(data.get("metrics"), dict):
        return "metrics: missing or not a mapping"
    if not isinstance(data.get("environment"), dict):
        return "environment: missing or not a mapping"
    for key, value in data["environment"].items():
        if not (value is None or isinstance(value, (str, int, float, bool))):
            return f"environment.{key}: {json.dumps(value)[:60]} is not a version or a name"
    if "rounds" in data and not (isinstance(data["rounds"], int) and not isinstance(data["rounds"], bool)):
        return f"rounds: {json.dumps(data['rounds'])[:60]} is not a count"
    if not isinstance(data.get("recorded", ""), str):
        return "recorded: not a date"
    if not is_timeline(data.get("timeline", [])):
        return "timeline: not a list of samples of numbers"
    for name, metric in data["metrics"].items():
        where = f"metrics.{name}"
        if not isinstance(metric, dict):
            return f"{where}: not a mapping"
        if metric.get("value") is not None and not is_number(metric["value"]):
            return f"{where}.value: {json.dumps(metric['value'])[:60]} is not a number"
        for text in ("reason", "detail"):
            if metric.get(text) is not None and not isinstance(metric[text], str):
                return f"{where}.{text}: not text"
        samples = metric.get("samples", [])
        if not isinstance(samples, list) or not all(is_number(v) for v in samples):
            return f"{where}.samples: not a list of numbers"
        if not (isinstance(metric.get("revision", 1), int) and not isinstance(metric.get("revision", 1), bool)):
            return f"{where}.revision: not a whole number"
    return None


def _stamped(name: str, value: MetricValue) -> dict:
    """The metric as stored, with the revision of its definition it was measured by."""
    out = value.to_json()
    revision = METRICS[name].revision if name in METRICS else 1
    if revision != 1:
        out["revision"] = revision
    return out


def _atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over: a crash leaves the old
    file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own error is the one to report
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _changes(old: Baseline | None, m: Measurement) -> list[str]:
    if old is None:
        return ["new baseline"]
    # Why the numbers may have moved first: what the run changed (a dependency bump, a new workload definition).
    lines = environment.differences(old.environment, m.environment, m.stack)
    lines += environment.software_changes(old.environment, m.environment, m.stack)
    moved = len(lines)
    for name in sorted(set(old.metrics) | set(m.metrics)):
        before = old.metrics.get(name, MetricValue(None)).value
        after = m.metrics.get(name, MetricValue(None)).value
        if before != after:
            unit = METRICS[name].unit if name in METRICS else ""
            lines.append(f"{name}: {units.format_value(before, unit)} -> {units.format_value(after, unit)}")
    return lines if len(lines) > moved else lines + ["no metric changed"]
