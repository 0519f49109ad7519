"""The time metrics every stack reports the same way: tokens_per_s, ttft, tpot.

A stack times its own requests (the harness cannot see inside a run) and hands the per-request times here,
so the three metrics mean one thing on every stack. time.wall and time.warmup are the harness's
(memcheck/measure_round.py); what the collectors cost is never inside these numbers.
"""
from __future__ import annotations

from ..metrics.value import MetricValue


def time_metrics(tokens: int, wall: float, ttfts: list[float], tpots: list[float],
                 ttft_detail: str | None = None) -> dict[str, MetricValue]:
    """tokens: generated in the run; wall: the run's seconds; ttfts: seconds to each request's first token;
    tpots: seconds per output token after the first, per request that made more than one."""
    return {
        "tokens_per_s": MetricValue(tokens / wall if wall else None),
        "ttft": (MetricValue(sum(ttfts) / len(ttfts), detail=ttft_detail) if ttfts
                 else MetricValue.null("no request produced a token")),
        "tpot": MetricValue(sum(tpots) / len(tpots)) if tpots else MetricValue.null("one new token only"),
    }
