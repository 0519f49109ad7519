"""The `memcheck` console script. Running and refreshing go through pytest, so they measure exactly
as `pytest --memcheck` does in CI."""
from __future__ import annotations

import argparse
import sys


def _pytest(args: list[str]) -> int:
    import pytest

    return int(pytest.main(["-p", "no:cacheprovider", *args]))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help="workload files or folders (default: the project's suites)")
    p.add_argument("--baselines", metavar="DIR", help="baseline folder (default: baselines/)")
    p.add_argument("--profile", metavar="NAME", help="workload profile (default: ci on CPU, full on GPU)")
    p.add_argument("--device", metavar="DEVICE", help="cpu, cuda or cuda:N")
    p.add_argument("-k", metavar="EXPR", dest="keyword", help="only items matching, as pytest -k")
    p.add_argument("--report", metavar="FILE.json", help="write the JSON report")
    p.add_argument("--markdown", metavar="FILE.md", help="write the Markdown report")


def _forward(ns) -> list[str]:
    args = ["--memcheck", *ns.paths]
    for flag, value in (("--memcheck-baselines", ns.baselines), ("--memcheck-profile", ns.profile),
                        ("--memcheck-device", ns.device), ("-k", ns.keyword),
                        ("--memcheck-report", ns.report), ("--memcheck-markdown", ns.markdown)):
        if value:
            args += [flag, value]
    return args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="memcheck", description="Memory regression checks for LLM inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run workloads and gate them against baselines (pytest --memcheck)")
    _common(run)
    run.add_argument("--strict", action="store_true", help="fail items without a baseline")
    baseline = sub.add_parser("baseline", help="manage baselines")
    bsub = baseline.add_subparsers(dest="action", required=True)
    refresh = bsub.add_parser("refresh", help="run workloads and write their baselines, printing what changed")
    _common(refresh)
    ns = parser.parse_args(argv)
    args = _forward(ns)
    if ns.command == "run":
        return _pytest(args + (["--memcheck-strict"] if ns.strict else []))
    return _pytest(args + ["--memcheck-update-baselines"])


if __name__ == "__main__":
    sys.exit(main())
