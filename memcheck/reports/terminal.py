"""The table printed at the end of a pytest session (and by the console script)."""
from __future__ import annotations

from .. import units
from ..metrics.catalog import METRICS
from ..states import Verdict
from .markdown import skipped_groups, unjudged_metrics

# The columns a reviewer scans first; everything else is in the JSON and Markdown reports.
COLUMNS = ("gpu.heap_alloc.peak", "cpu.heap_alloc.peak", "kv.bytes.peak", "kv.waste.peak", "host.rss.peak")
PREDICTED_COLUMNS = ("predicted.gpu.heap_alloc.peak", "predicted.gpu.reserved.peak", "kv.bytes.peak", "kv.waste.peak")


def columns(report) -> tuple[str, ...]:
    """A prediction's run shows what it predicts; its measured columns would all be null."""
    predicted = any("predicted.gpu.heap_alloc.peak" in r.measurement.metrics for r in report.items)
    return PREDICTED_COLUMNS if predicted else COLUMNS


def cell(name: str, value) -> str:
    return "-" if value is None else units.format_value(value, METRICS[name].unit if name in METRICS else "")


def aligned(rows: list[tuple | list]) -> list[str]:
    """Rows as left-aligned columns, a rule under the first (the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _gpu_cell(m) -> str:
    return "-" if m.gpu_seconds is None else f"{m.gpu_seconds:.1f}"


def table(report) -> list[str]:
    on_gpu = report.gpu_seconds is not None  # what each item cost the GPU runner, in seconds of its GPU
    shown = columns(report)
    rows = [("item", "verdict", *shown, *(["GPU s"] if on_gpu else []))]
    for r in report.items:
        metrics = r.measurement.metrics
        cells = [cell(name, metrics[name].value if name in metrics else None) for name in shown]
        rows.append((r.id, r.verdict.upper() if r.failed else r.verdict, *cells,
                     *([_gpu_cell(r.measurement)] if on_gpu else [])))
        for rank in r.measurement.ranks or ():  # tensor parallel: the item's row is the max across ranks
            rows.append((f"  rank {rank['rank']}", "", *(cell(n, rank["metrics"].get(n)) for n in shown),
                         *([""] if on_gpu else [])))
    lines = aligned(rows)
    for r in report.items:
        if r.verdict not in (Verdict.PASS, Verdict.NEW, Verdict.SKIPPED) or r.failed:  # skips: a line per reason
            lines.append(f"{r.id}: {r.verdict}: {r.reason}")
        if r.compared_across and r.verdict != Verdict.REGRESSED:  # a regression's reason names the bump already
            lines.append(f"{r.id}: {r.verdict}, compared across: {', '.join(r.compared_across)}")
        if r.updated:
            lines.append(f"{r.id}: baseline written to {r.baseline_path}: " + "; ".join(r.updated))
    for reason, ids in skipped_groups([r for r in report.items if not r.failed]):
        lines.append(f"{ids[0]}: skipped: {reason}" if len(ids) == 1
                     else f"memcheck: {len(ids)} items skipped: {reason} ({', '.join(ids)})")
    untimed = unjudged_metrics(report.items)
    if untimed:  # said once, as in the Markdown report
        lines.append(f"memcheck: time not gated in this profile (noisy metrics, judged through 3 or more rounds), "
                     f"not compared: {', '.join(untimed)}")
    if on_gpu:
        seconds, held, count = report.gpu_seconds
        lines.append(f"memcheck: {seconds:.1f} GPU seconds over {count} items" + (
            f" (they held a GPU {held:.1f} s, sharing it: GPU s splits each moment among the items holding it)"
            if held > seconds + 0.05 else ""))
    summary = ", ".join(f"{n} {v}" for v, n in report.summary.items())
    lines.append(f"memcheck: {summary or 'no items'}")
    return lines
