"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network) with the verdict
table, a memory-over-time plot per workload for every stack that ran it, each item's checks, and the
environment. jinja2 autoescapes every value; the only markup inserted as-is is the SVG that plot.py
builds with its own escaping."""
from __future__ import annotations

import os

import jinja2
import markupsafe

from .. import units
from ..floors import describe as describe_floors
from ..metrics.catalog import METRICS
from . import plot
from .report import ORDER
from .markdown import ICONS, MEMORY_VIZ, _value, bisect_commands, safe_url, split_checks
from .ranks import rank_columns
from .terminal import COLUMNS, PREDICTED_COLUMNS


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("memcheck", "reports/templates"),
                             autoescape=jinja2.select_autoescape(["html", "html.j2"], default=True),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined)
    env.filters.update(wbr=_wbr, value=_value, bytes=units.format_bytes, percent=units.format_percent)
    env.globals.update(describe_floors=describe_floors, ICONS=ICONS, COLUMNS=COLUMNS, MEMORY_VIZ=MEMORY_VIZ, METRICS=METRICS,
                       rank_columns=rank_columns, split_checks=split_checks,
                       bisect_commands=bisect_commands)
    return env


def render(report, artifact_url: str | None = None) -> str:
    workloads = []
    for name, items in report.workloads().items():
        charts = plot.panels(items)
        for chart in charts:
            chart.svg = markupsafe.Markup(chart.svg)  # built and escaped by plot.svg
        workloads.append({"name": name, "results": items, "charts": charts, "baseline": plot.baseline_label(items),
                          "colors": plot.color_of([r.measurement.stack for r in items])})
    ordered = sorted(report.items, key=lambda r: ORDER.index(r.verdict) if r.verdict in ORDER else len(ORDER))
    columns = [c for c in dict.fromkeys((*PREDICTED_COLUMNS, *COLUMNS)) if any(_measured(r, c) for r in report.items)]
    env_keys = [k for k in dict.fromkeys(k for e in report.environments for k in e) if k != "device_class"]
    return environment().get_template("report.html.j2").render(env_keys=env_keys,
        report=report, ordered=ordered, workloads=workloads, columns=columns, artifact_url=safe_url(artifact_url))


def write(report, path: str, artifact_url: str | None = None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(render(report, artifact_url))
    os.replace(tmp, path)


def _measured(item, metric: str) -> bool:
    v = item.measurement.metrics.get(metric)
    return v is not None and v.value is not None


def _wbr(text) -> markupsafe.Markup:
    """Escaped text that may break after each dot (long metric names in narrow table headers)."""
    return markupsafe.Markup(".<wbr>").join(markupsafe.escape(part) for part in str(text).split("."))
