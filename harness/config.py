"""Project settings: built-in rule defaults (defaults.toml) overridden by [tool.memcheck] in pyproject.toml."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import rules
from .errors import UsageError

_DEFAULTS = Path(__file__).with_name("defaults.toml")
KEYS = {"thresholds", "suites", "baselines"}


@dataclass
class Config:
    thresholds: dict[str, rules.Rule] = field(default_factory=dict)
    suites: list[str] = field(default_factory=lambda: ["suites"])
    baselines: str = "baselines"
    source: str = "built-in defaults"


def load(rootdir: str | Path | None = None) -> Config:
    with open(_DEFAULTS, "rb") as f:
        raw_thresholds = dict(tomllib.load(f)["thresholds"])
    config = Config()
    pyproject = Path(rootdir or ".") / "pyproject.toml"
    if pyproject.is_file():
        try:
            with open(pyproject, "rb") as f:
                section = tomllib.load(f).get("tool", {}).get("memcheck", {})
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"TOML syntax: {e}", str(pyproject)) from None
        unknown = set(section) - KEYS
        if unknown:
            raise UsageError(f"unknown key; known: {', '.join(sorted(KEYS))}", str(pyproject),
                             field=f"tool.memcheck.{sorted(unknown)[0]}")
        raw_thresholds.update(section.get("thresholds", {}))
        config.suites = list(section.get("suites", config.suites))
        config.baselines = section.get("baselines", config.baselines)
        config.source = str(pyproject)

    def where(field_path, message):
        return UsageError(message, config.source, field=f"tool.memcheck.thresholds.{field_path}")

    for metric, raw in raw_thresholds.items():
        rule = rules.parse(metric, raw, where)
        if rule is not None:
            config.thresholds[metric] = rule
    return config
