"""Project settings: built-in rule defaults (defaults.toml) overridden by [tool.memcheck] in pyproject.toml."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import environment, rules
from .errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the tomli backport (a dependency there)
    import tomli as tomllib

_DEFAULTS = Path(__file__).with_name("defaults.toml")
KEYS = {"thresholds", "suites", "baselines", "strict_environment"}


@dataclass
class Config:
    thresholds: dict[str, rules.Rule] = field(default_factory=dict)
    suites: list[str] = field(default_factory=lambda: ["suites"])
    baselines: str = "baselines"
    # Software fields of the fingerprint whose change makes a baseline incomparable instead of judged across.
    strict_environment: tuple[str, ...] = ()
    source: str = "built-in defaults"


def load(rootdir: str | Path | None = None) -> Config:
    with open(_DEFAULTS, "rb") as f:
        defaults = tomllib.load(f)["thresholds"]
    config = Config(thresholds=rules.merge({}, defaults, _where(str(_DEFAULTS), "thresholds")))
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
        config.suites = list(section.get("suites", config.suites))
        config.baselines = section.get("baselines", config.baselines)
        config.source = str(pyproject)
        config.strict_environment = _strict_environment(section.get("strict_environment", []), config.source)
        config.thresholds = rules.merge(config.thresholds, section.get("thresholds", {}),
                                        _where(config.source, "tool.memcheck.thresholds"))
    return config


def _where(source: str, prefix: str):
    return lambda field_path, message: UsageError(message, source, field=f"{prefix}.{field_path}".rstrip("."))


def _strict_environment(raw, source: str) -> tuple[str, ...]:
    where = "tool.memcheck.strict_environment"
    if not isinstance(raw, list):
        raise UsageError(f"must be a list of fingerprint fields, e.g. [\"torch\"]; got {raw!r}", source, field=where)
    for i, name in enumerate(raw):
        if name not in environment.SOFTWARE:
            physical = " (always strict)" if name in environment.PHYSICAL else ""
            raise UsageError(f"{name!r}{physical} is not a software field; known: {', '.join(environment.SOFTWARE)}",
                             source, field=f"{where}[{i}]")
    return tuple(raw)
