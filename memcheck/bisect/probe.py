"""One probe of a bisect: the item alone, through pytest in a given interpreter and folder, judged against the good
point's run as `memcheck compare` judges."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .. import project, yamlfile
from ..check import entries, workload_files
from ..compare import compare
from ..errors import UsageError
from ..reports.report import Report
from ..states import CheckStatus
from ..verdict import ItemResult
from .search import BAD, GOOD, SKIP


@dataclass
class Probe:
    point: str  # a release or a commit
    status: str  # good | bad | skip
    verdict: str = ""  # against the good point's run
    reason: str = ""
    metrics: dict = field(default_factory=dict)  # name -> value
    regressed: list[str] = field(default_factory=list)  # the metrics whose rules it broke


def locate(item: str, root: str = ".") -> str:
    """ITEM as pytest names it (`r1-32k[hf]`, or with its file: `suites/r1.yaml::r1-32k[hf]`) as a node id
    relative to the project root: the workload file that defines it, among the project's suites."""
    if "::" in item:
        return item
    found = re.fullmatch(r"(.+)\[([^\]]+)\]", item)
    if not found:
        raise UsageError(f"{item!r} is not an item: write it as pytest names it, e.g. r1-32k[hf]")
    name = found.group(1)
    suites = project.load(root).suites
    for path in workload_files([os.path.join(root, p) for p in suites]):
        if any(isinstance(e, dict) and e.get("name") == name for e in entries(yamlfile.load(path).data)):
            return f"{os.path.relpath(path, root)}::{item}"
    raise UsageError(f"no workload named {name!r} in the project's suites ({', '.join(suites)})")


def run_item(python: str, cwd: Path, node: str, out: Path, profile: str | None, env: dict | None = None) -> Report:
    """The item measured in a fresh pytest, its baseline in a scratch folder (never the project's)."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.json"
    report.unlink(missing_ok=True)
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--memcheck", node,
           "--memcheck-baselines", str(out / "baselines"), "--memcheck-report", str(report)]
    cmd += ["--memcheck-profile", profile] if profile else []
    with open(out / "pytest.log", "w") as log:
        done = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if not report.exists():
        raise RuntimeError(f"pytest exited {done.returncode} without a report (its output: {out / 'pytest.log'})")
    return Report.load(str(report))


def judge(point: str, run: Report, good: Report, good_path: str) -> Probe:
    """good or bad by the verdict against the good point's run; skip where the item did not run there."""
    if len(run.items) != 1:
        return Probe(point, SKIP, "error", f"{len(run.items)} items ran, not 1")
    ran: ItemResult = run.items[0]
    metrics = {k: v.value for k, v in ran.measurement.metrics.items()}
    if ran.verdict in ("error", "skipped"):
        return Probe(point, SKIP, ran.verdict, ran.reason, metrics)
    result = compare(good, run, good_path).items[0]
    status = {"regressed": BAD, "pass": GOOD, "improved": GOOD}.get(result.verdict, SKIP)
    regressed = [c.metric for c in result.checks if c.status == CheckStatus.REGRESSED]
    return Probe(point, status, result.verdict, result.reason, metrics, regressed)
