"""A run's memory over its steps, as a baseline keeps it: the plotted series only, at most POINTS samples, so a
baseline stays a few KB a metric and the report can draw the past under today's curve."""
from __future__ import annotations

from .units import is_number

POINTS = 64
KEYS = ("gpu.allocated", "gpu.reserved", "predicted.gpu.allocated", "predicted.gpu.reserved", "host.rss", "kv.bytes",
        "kv.live_bytes")  # what reports/plot.py draws


def downsample(timeline: list[dict], points: int = POINTS) -> list[dict]:
    """Every `step` with the plotted keys; past `points` samples, evenly spaced ones, the first, the last and the
    sample of each key's peak kept (a peak is what a regression moves)."""
    samples = [{k: p[k] for k in ("step", *KEYS) if is_number(p.get(k))} for p in timeline if is_number(p.get("step"))]
    samples = [s for s in samples if len(s) > 1]
    if len(samples) <= points:
        return samples
    keep = {round(i * (len(samples) - 1) / (points - 1)) for i in range(points)}
    for key in KEYS:
        peaks = [i for i, s in enumerate(samples) if key in s]
        if peaks:
            keep.add(max(peaks, key=lambda i: samples[i][key]))
    return [samples[i] for i in sorted(keep)]


def is_timeline(value) -> bool:
    return isinstance(value, list) and all(isinstance(p, dict) and all(is_number(v) for v in p.values()) for p in value)
