"""Memory-over-time plots as inline SVG, for the self-contained HTML report. No plotting library: a
line chart of a few series is a few dozen lines, and the report must open without any network.

A workload's timeline panels (one chart each, every stack that ran the workload as one line colour):
  GPU runners: the torch allocator's allocated (solid) and reserved (dashed) bytes per decode step
  CPU runners: the worker process's resident set per decode step
  both:        the KV cache's reserved (solid) and live (dashed) bytes, when the stack reports them
Where the item's baseline kept its timeline, each line has the baseline's beside it, faded and drawn first.
Every text that reaches the SVG is escaped here; callers pass plain strings.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from .. import units

# Okabe-Ito: distinguishable with the common colour-vision deficiencies, and in print.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 30, 42

PANELS = (
    # title, [(timeline key, line label, dashed)]
    ("GPU memory (torch allocator)", (("gpu.allocated", "allocated", False), ("gpu.reserved", "reserved", True))),
    ("GPU memory predicted (allocator model, fake tensors)",
     (("predicted.gpu.allocated", "allocated", False), ("predicted.gpu.reserved", "reserved", True))),
    ("Host memory (resident set of the worker process)", (("host.rss", "RSS", False),)),
    ("KV cache", (("kv.bytes", "reserved", False), ("kv.live_bytes", "live", True))),
)


@dataclass
class Series:
    stack: str
    label: str
    color: str
    dashed: bool
    points: list[tuple[float, float]] = field(default_factory=list)
    baseline: bool = False  # the baseline's curve: drawn faded, under today's


@dataclass
class Panel:
    title: str
    series: list[Series]
    svg: str = ""

    @property
    def legend(self) -> list[Series]:
        return self.series


def color_of(stacks: list[str]) -> dict[str, str]:
    return {s: COLORS[i % len(COLORS)] for i, s in enumerate(stacks)}


def panels(items) -> list[Panel]:
    """The charts of one workload: `items` are the ItemResults of every stack that ran it."""
    colors = color_of([r.measurement.stack for r in items])
    out = []
    for title, keys in PANELS:
        series = []
        for r in items:
            for key, label, dashed in keys:
                past = _points(r.baseline_timeline, key)
                if len(past) > 1:
                    series.append(Series(r.measurement.stack, f"{label}, baseline", colors[r.measurement.stack],
                                         dashed, past, baseline=True))
                pts = _points(r.measurement.timeline, key)
                if len(pts) > 1:  # one sample is no curve (a fixture block's single step): the table says it
                    twin = next((o for o in series if o.stack == r.measurement.stack and o.points == pts
                                 and not o.baseline), None)
                    if twin:  # drawn exactly under the other line: say so, or it looks missing
                        label = f"{label} (= {twin.label})"
                    series.append(Series(r.measurement.stack, label, colors[r.measurement.stack], dashed, pts))
        if series:
            out.append(Panel(title, series))
    # One x axis for every panel of the workload, so steps line up side by side.
    steps = [x for panel in out for s in panel.series for x, _ in s.points]
    for panel in out:
        panel.svg = svg(panel, (min(steps), max(steps)))
    return out


def _points(timeline, key: str) -> list[tuple[float, float]]:
    return [(float(p["step"]), float(p[key])) for p in timeline
            if isinstance(p.get(key), (int, float)) and isinstance(p.get("step"), (int, float))]


def baseline_label(items) -> str:
    """What the faded curves are: the baseline's commit and the versions it ran under (its fingerprint)."""
    for r in items:
        env = r.baseline_environment
        if r.baseline_timeline and env:
            parts = [f"commit {env['git_sha'][:10]}"] if env.get("git_sha") else []
            parts += [f"{k} {env[k]}" for k in ("torch", "transformers", "vllm") if env.get(k)]
            return f"Faded: the baseline's curves (recorded {r.baseline_recorded or 'earlier'}; {', '.join(parts)})."
    return ""


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^k steps; binary-friendly for bytes)."""
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        ticks.append(v)
        v += step
    if ticks[-1] < hi:
        ticks.append(ticks[-1] + step)
    return ticks


def _byte_unit(hi: float) -> tuple[str, float]:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if hi >= size:
            return unit, size
    return "B", 1


def svg(panel: Panel, xrange: tuple[float, float] | None = None) -> str:
    xs = [x for s in panel.series for x, _ in s.points]
    ys = [y for s in panel.series for _, y in s.points]
    unit, scale = _byte_unit(max(ys))
    yticks = nice_ticks(min(ys) / scale, max(ys) / scale)
    x0, x1 = xrange or (min(xs), max(xs))
    xticks = [t for t in nice_ticks(x0, x1, 6) if float(t).is_integer() and x0 <= t <= x1] or [x0, x1]
    y0, y1 = yticks[0], yticks[-1]
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1) * pw

    def py(y: float) -> float:
        return TOP + ph - (y / scale - y0) / ((y1 - y0) or 1) * ph

    e = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
             f'height="{HEIGHT}" role="img" aria-label="{e(panel.title)}" class="plot">',
             f'<text x="{LEFT}" y="18" class="title">{e(panel.title)}</text>']
    for t in yticks:
        y = py(t * scale)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" class="ytick">{e(_tick(t))} {unit}</text>')
    for t in xticks:
        x = px(t)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + ph}" y2="{TOP + ph + 5}" class="axis"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + ph + 18}" class="xtick">{int(t)}</text>')
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + ph}" y2="{TOP + ph}" class="axis"/>')
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}" class="axis"/>')
    parts.append(f'<text x="{LEFT + pw / 2:.1f}" y="{HEIGHT - 6}" class="xlabel">decode step</text>')
    for s in panel.series:
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="7 4"' if s.dashed else ""
        look = ' stroke-width="5" stroke-opacity="0.3"' if s.baseline else ' stroke-width="2.2"'
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{s.color}"{look}{dash}>'
                     f'<title>{e(s.stack)}: {e(s.label)}</title></polyline>')
        if len(s.points) <= 40 and not s.baseline:
            for x, y in s.points:
                parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.6" fill="{s.color}">'
                             f'<title>{e(s.stack)} {e(s.label)}, step {int(x)}: {e(units.format_bytes(y))}</title>'
                             f'</circle>')
    parts.append("</svg>")
    return "".join(parts)


def _tick(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}".rstrip("0").rstrip(".")
