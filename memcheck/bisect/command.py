"""`memcheck bisect ITEM --package NAME --good A --bad B` and `memcheck bisect ITEM --git GOOD..BAD`."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..errors import UsageError
from ..reports.exports import write_text
from ..reports.report import Report
from ..reports.terminal import aligned, cell
from . import commits, environments, releases
from .probe import Probe, judge, locate, run_item
from .search import BAD, GOOD, SKIP, Outcome, bisect

CACHE = Path(".memcheck") / "bisect"
HEADLINE = ("gpu.heap_alloc.peak", "cpu.heap_alloc.peak", "kv.bytes.peak")  # shown when nothing regressed


def add_arguments(parser) -> None:
    parser.add_argument("item", help="the item as pytest names it: r1-32k[hf] (or suites/r1.yaml::r1-32k[hf])")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--package", metavar="NAME", help="bisect the releases of this package (with --good/--bad)")
    where.add_argument("--git", metavar="GOOD..BAD", help="bisect the commits of this repository's range")
    parser.add_argument("--good", metavar="VERSION", help="a release where the item passes")
    parser.add_argument("--bad", metavar="VERSION", help="a release where it regressed")
    parser.add_argument("--profile", help="the profile to run the item at (default: this runner's)")
    parser.add_argument("--report", metavar="FILE.json", help="write the bisect as JSON")
    parser.add_argument("--markdown", metavar="FILE.md", help="write the bisect as Markdown")


def main(ns) -> int:
    try:
        return _bisect(ns)
    except UsageError as e:
        print(f"memcheck bisect: error: {e}", file=sys.stderr)
        return 2


def _bisect(ns) -> int:
    node = locate(ns.item)
    if ns.package:
        if not (ns.good and ns.bad):
            raise UsageError("--package needs --good VERSION and --bad VERSION")
        points = releases.between(releases.index_versions(ns.package), ns.good, ns.bad)
        what = f"{ns.package} {ns.good} .. {ns.bad}"
    else:
        if ns.good or ns.bad:
            raise UsageError("--git takes its range as GOOD..BAD; --good and --bad are for --package")
        points = commits.commits_between(ns.git)
        root = commits.repository_root()
        what = f"commits {ns.git}"
    print(f"memcheck bisect: {node}, {len(points)} points ({what}); about {_steps(len(points))} probes")
    probes: dict[str, Probe] = {}
    good: list[Report] = []
    started = time.monotonic()

    def probe(point: str) -> str:
        t0 = time.monotonic()
        out = CACHE / "runs" / _safe(ns.package or "git") / _safe(point)
        try:
            if ns.package:
                python, cwd, env = str(environments.probe_environment(ns.package, point, CACHE / "envs")), Path("."), {}
            else:
                tree = commits.worktree(point, CACHE, str(root))
                python, cwd, env = sys.executable, tree / Path.cwd().resolve().relative_to(root.resolve()), {"PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
            run = run_item(python, cwd, node, out.resolve(), ns.profile, env)
        except (environments.InstallFailed, RuntimeError, UsageError) as e:
            result = Probe(point, SKIP, "error", f"cannot run it here: {e}")
        else:
            if not good:  # the good point: its run is what every other probe is judged against
                good.append(run)
                ran = run.items[0] if len(run.items) == 1 else None
                if ran is None or ran.verdict in ("error", "skipped"):
                    raise UsageError(f"the good point {point} does not run {node}: "
                                     f"{ran.reason if ran else 'no item ran'} ({out / 'pytest.log'})")
                result = Probe(point, GOOD, "good point", metrics={k: v.value for k, v in
                                                                  ran.measurement.metrics.items()})
            else:
                result = judge(point, run, good[0], str(out))
        probes[point] = result
        print(f"  {point}: {result.status} ({result.verdict}) in {time.monotonic() - t0:.0f} s", flush=True)
        if point == points[-1] and result.status == SKIP:  # no bad end, nothing to search towards
            raise UsageError(f"the bad point {point} does not run {node}: {result.reason}")
        return result.status

    outcome = bisect(points, probe)
    bad = probes.get(points[-1])
    shown = (bad.regressed if bad and bad.status == BAD else []) or [
        n for n in HEADLINE if any(p.metrics.get(n) is not None for p in probes.values())]
    lines = _table(points, probes, shown)
    verdict = _conclusion(outcome, points, what)
    if ns.git and outcome.first_bad:
        verdict += f"\n{outcome.first_bad} {commits.subject(outcome.first_bad, str(root))}"
    print("\n".join(lines + ["", verdict, f"({len(probes)} probes in {time.monotonic() - started:.0f} s)"]))
    code = 0 if outcome.first_bad else (2 if outcome.could_be else 1)
    if ns.report:
        write_text(ns.report, json.dumps({
            "item": node, "what": what, "profile": ns.profile, "points": points, "first_bad": outcome.first_bad,
            "could_be": outcome.could_be, "exit": code,
            "probes": [vars(probes[p]) for p in points if p in probes]}, indent=2) + "\n")
    if ns.markdown:
        write_text(ns.markdown, f"## memcheck bisect: `{node}`\n\n" + "\n".join(_markdown(points, probes, shown))
               + f"\n\n{verdict}\n")
    return code


def _steps(n: int) -> int:
    return 2 + max(0, (n - 2).bit_length())


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)


def _rows(points: list[str], probes: dict[str, Probe], shown: list[str]) -> list[list[str]]:
    rows = []
    for point in points:
        p = probes.get(point)
        if p is None:
            continue
        rows.append([point, *(cell(n, p.metrics.get(n)) for n in shown), f"{p.status} ({p.verdict})"])
    return rows


def _table(points, probes, shown) -> list[str]:
    return aligned([["point", *shown, "verdict"], *_rows(points, probes, shown)])


def _markdown(points, probes, shown) -> list[str]:
    head = ["point", *(f"`{n}`" for n in shown), "verdict"]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in _rows(points, probes, shown))]


def _conclusion(outcome: Outcome, points: list[str], what: str) -> str:
    if outcome.first_bad:
        before = points[points.index(outcome.first_bad) - 1]
        return f"first bad: {outcome.first_bad} (the last good before it: {before})"
    if outcome.could_be:
        return f"no single first bad: the skipped points leave any of {', '.join(outcome.could_be)}"
    return f"no regression in {what}: {points[-1]} is not regressed against {points[0]}"

