"""Where each item's time went, per phase: the table printed by `--memcheck-durations` (`memcheck run
--durations`), so the next slowdown of the gate shows which item and which phase it is in."""
from __future__ import annotations

PHASES = ("startup", "gpu_wait", "build", "warmup", "run", "teardown", "exit", "memory_round", "report")


def table(report, count: int = 0) -> list[str]:
    """The `count` slowest items (0: all), one column per phase, and the phases' totals over every item."""
    items = [r for r in report.items if r.measurement.phases]
    items.sort(key=lambda r: -sum(r.measurement.phases.values()))
    shown = items[:count] if count else items
    rows = [("item", *PHASES, "total")]
    for r in shown:
        phases = r.measurement.phases
        rows.append((r.id, *(_seconds(phases.get(p)) for p in PHASES), _seconds(sum(phases.values()))))
    totals = [sum(r.measurement.phases.get(p, 0.0) for r in items) for p in PHASES]
    rows.append((f"all {len(items)} items", *(_seconds(t) for t in totals), _seconds(sum(totals))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, lines[1])
    contended = [r for r in items if any("under contention" in n for n in r.measurement.notes)]
    if contended:
        lines.append(f"{len(contended)} items were measured in parallel with others (-n): their times are "
                     "under contention")
    return lines


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}s"
