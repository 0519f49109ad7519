"""Markdown report rendered with jinja2: the file CI keeps and the body of the merge-request comment."""
from __future__ import annotations

import html
import re

import jinja2

from .. import units
from ..metrics.catalog import METRICS

MARKER = "<!-- memcheck-report -->"  # finds our comment again on the merge request
ICONS = {"pass": "✅", "regressed": "❌", "error": "💥", "improved": "🎉", "new": "🆕", "incomparable": "⚠️",
         "skipped": "⏭️"}


def md_escape(text) -> str:
    """Text from users or exceptions as inert Markdown: no HTML, no table breaks, no links."""
    text = html.escape(str(text), quote=False)
    return re.sub(r"([\\`*_{}\[\]|#!])", r"\\\1", text).replace("\n", " ")


def _value(value, metric: str, signed: bool = False) -> str:
    unit = METRICS[metric].unit if metric in METRICS else ""
    return units.format_value(value, unit, signed)


def environment(loader_pkg: str = "harness") -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader(loader_pkg, "reports/templates"),
                             autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(md=md_escape, value=_value, bytes=units.format_bytes, percent=units.format_percent)
    env.globals.update(ICONS=ICONS, MARKER=MARKER, METRICS=METRICS)
    return env


def render(report, artifact_url: str | None = None) -> str:
    return environment().get_template("report.md.j2").render(report=report, artifact_url=artifact_url)
