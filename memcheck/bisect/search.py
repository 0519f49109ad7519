"""The binary search of a bisect, over candidates that a probe marks good, bad or unrunnable (git bisect's skip)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass
class Outcome:
    first_bad: str | None  # None: the range holds no regression, or only skipped candidates are left
    tested: dict[str, str] = field(default_factory=dict)  # candidate -> good | bad | skip, in probing order
    could_be: list[str] = field(default_factory=list)  # where skips leave the answer open: every candidate it may be


def bisect(candidates: list[str], probe: Callable[[str], str]) -> Outcome:
    """candidates[0] is the good point and candidates[-1] the bad one; both are probed first. The search keeps
    lo good and hi bad, and probes the untried candidate nearest the middle of them."""
    out = Outcome(None)
    for end in (candidates[0], candidates[-1]):
        out.tested[end] = probe(end)
    if out.tested[candidates[0]] != GOOD:
        raise ValueError(f"the good point {candidates[0]} is {out.tested[candidates[0]]}, not good")
    if out.tested[candidates[-1]] != BAD:
        return out
    lo, hi = 0, len(candidates) - 1
    while hi - lo > 1:
        left = [i for i in range(lo + 1, hi) if candidates[i] not in out.tested]
        if not left:  # only skipped candidates between the last good and the first bad
            out.could_be = candidates[lo + 1:hi + 1]
            return out
        mid = min(left, key=lambda i: (abs(i - (lo + hi) / 2), i))
        verdict = out.tested[candidates[mid]] = probe(candidates[mid])
        if verdict == BAD:
            hi = mid
        elif verdict == GOOD:
            lo = mid
    out.first_bad = candidates[hi]
    return out
