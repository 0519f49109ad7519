"""Parsing and formatting of sizes, percentages and durations: the one place that knows units."""
from __future__ import annotations

import math
import re

_BINARY = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([kmgt]i?b|b)\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%\s*$")


def parse_size(text: str) -> int:
    """'64MiB' -> 67108864. Raises ValueError with a message a user can act on."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 512KiB, 64MiB, 1.5GB)")
    unit = m.group(2).lower()
    return int(float(m.group(1)) * (_BINARY.get(unit) or _DECIMAL[unit]))


def parse_percent(text: str) -> float:
    """'2%' -> 0.02."""
    m = _PERCENT.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a percentage (example: 2%)")
    return float(m.group(1)) / 100.0


def is_percent(text) -> bool:
    return isinstance(text, str) and bool(_PERCENT.match(text))


def is_size(text) -> bool:
    return isinstance(text, str) and bool(_SIZE.match(text))


def is_number(value) -> bool:
    """An int or a float, not a bool (JSON's true would pass isinstance(value, int))."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_bytes(n: float | None, signed: bool = False) -> str:
    if n is None:
        return "null"
    sign = ("+" if n > 0 else "-" if n < 0 else "") if signed else ("-" if n < 0 else "")
    n = abs(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


def format_value(value: float | None, unit: str, signed: bool = False) -> str:
    """Render a metric value in its unit: bytes as KiB/MiB/GiB, ratios as percentages."""
    if value is None:
        return "null"
    if unit == "bytes":
        return format_bytes(value, signed)
    sign = "+" if signed and value > 0 else ""
    if unit == "ratio":
        return f"{sign}{value * 100:.2f}%"
    if unit == "s":
        return f"{sign}{value * 1000:.1f} ms" if abs(value) < 1 else f"{sign}{value:.2f} s"
    if isinstance(value, float) and not value.is_integer():
        return f"{sign}{value:,.2f}"
    return f"{sign}{int(value):,}"


def format_percent(fraction: float | None, signed: bool = True) -> str:
    if fraction is None or math.isinf(fraction) or math.isnan(fraction):
        return "n/a"
    return f"{'+' if signed and fraction > 0 else ''}{fraction * 100:.2f}%"
