"""The session report: every item's result plus the environment, and the JSON that other tools read.

JSON schema `memcheck.report/1`: {schema, created, profile, environment, summary: {verdict: count},
failed, items: [ItemResult.to_json()]}. `memcheck comment` and `memcheck merge` read this file.
"""
from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from dataclasses import dataclass, field

from ..verdict import ItemResult

SCHEMA = "memcheck.report/1"
ORDER = ("regressed", "error", "improved", "incomparable", "new", "pass", "skipped")


@dataclass
class Report:
    items: list[ItemResult] = field(default_factory=list)
    profile: str | None = None
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
                         .isoformat(timespec="seconds"))

    @property
    def summary(self) -> dict[str, int]:
        counts = Counter(r.verdict for r in self.items)
        return {v: counts[v] for v in ORDER if counts[v]}

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.items)

    @property
    def environment(self) -> dict:
        envs = [r.measurement.environment for r in self.items if r.measurement.environment]
        return envs[0] if envs else {}

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "profile": self.profile,
                "environment": self.environment, "summary": self.summary, "failed": self.failed,
                "items": [r.to_json() for r in self.items]}

    def write_json(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
