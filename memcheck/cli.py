"""The `memcheck` console script. Running and refreshing go through pytest, so they measure exactly
as `pytest --memcheck` does in CI."""
from __future__ import annotations

import argparse
import glob
import os
import sys


def _pytest(args: list[str]) -> int:
    import pytest

    return int(pytest.main(["-p", "no:cacheprovider", *args]))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help="workload files or folders (default: the project's suites)")
    p.add_argument("--baselines", metavar="DIR", help="baseline folder (default: baselines/)")
    p.add_argument("--profile", metavar="NAME", help="workload profile (default: ci on CPU, full on GPU)")
    p.add_argument("--device", metavar="DEVICE", help="cpu, cuda or cuda:N")
    p.add_argument("--predict", metavar="GPU", help="predict the GPU memory for GPU (nvidia-h200) on this CPU runner "
                   "instead of measuring (default profile: full)")
    p.add_argument("-k", metavar="EXPR", dest="keyword", help="only items matching, as pytest -k")
    p.add_argument("--report", metavar="FILE.json", help="write the JSON report")
    p.add_argument("--markdown", metavar="FILE.md", help="write the Markdown report")
    p.add_argument("--html", metavar="FILE.html", help="write the HTML report (memory-over-time plots)")
    p.add_argument("--junitxml", metavar="FILE.xml", help="write JUnit XML (verdicts as properties)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="pytest's header, progress and warnings too (default: the verdicts and errors only)")


# Quiet by default: a reviewer reads the verdict table and the errors, not pytest's header or its warnings.
QUIET = ["-q", "--no-header", "-p", "no:warnings"]


def _forward(ns) -> list[str]:
    args = ["--memcheck", *ns.paths, *([] if ns.verbose else QUIET)]
    for flag, value in (("--memcheck-baselines", ns.baselines), ("--memcheck-profile", ns.profile),
                        ("--memcheck-device", ns.device), ("--memcheck-predict", ns.predict), ("-k", ns.keyword),
                        ("--memcheck-report", ns.report), ("--memcheck-markdown", ns.markdown),
                        ("--memcheck-html", ns.html), ("--junitxml", ns.junitxml)):
        if value or (flag == "--memcheck-predict" and value is not None):  # an empty GPU name is refused, not dropped
            args += [flag, value]
    return args


USAGE_ERROR = 4  # pytest's exit code for a usage error


def _error(message: str) -> int:
    print(f"memcheck: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _add_report_commands(sub) -> None:
    comment = sub.add_parser(
        "comment", help="post the report on the merge/pull request of this CI job, updating the same comment",
        description="Post the Markdown report on the merge request (GitLab) or pull request (GitHub) of the "
                    "current CI job; later runs update that same comment. Tokens are read from the environment "
                    "only: MEMCHECK_GITLAB_TOKEN or GITLAB_TOKEN (GitLab), GITHUB_TOKEN (GitHub).")
    comment.add_argument("--report", metavar="REPORT.json", required=True, nargs="+",
                         help="the JSON report (several are merged first)")
    comment.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    comment.add_argument("--platform", choices=("gitlab", "github"), help="default: detected from the CI variables")
    comment.add_argument("--api-url", metavar="URL", help="API root (default: CI_API_V4_URL / GITHUB_API_URL)")
    comment.add_argument("--project", metavar="ID", help="GitLab project id or path (default: "
                                                         "CI_MERGE_REQUEST_PROJECT_ID, else CI_PROJECT_ID)")
    comment.add_argument("--mr", metavar="IID", help="GitLab merge request IID (default: CI_MERGE_REQUEST_IID)")
    comment.add_argument("--repo", metavar="OWNER/NAME", help="GitHub repository (default: GITHUB_REPOSITORY)")
    comment.add_argument("--pr", metavar="NUMBER", help="GitHub pull request (default: from the event file)")
    comment.add_argument("--event-path", metavar="FILE", help="GitHub event file (default: GITHUB_EVENT_PATH)")
    comment.add_argument("--token-env", metavar="VAR", help="read the token from this variable instead")
    comment.add_argument("--artifact-url", metavar="URL",
                         help="where the full report is (default: the pipeline / triggering run page)")

    merge = sub.add_parser("merge", help="merge reports of parallel jobs or xdist workers into one",
                           description="Merge JSON reports into one. An item present in several keeps the "
                                       "result of the report created last (and says so).")
    merge.add_argument("reports", nargs="+", metavar="REPORT.json", help="reports, or folders of *.json reports")
    merge.add_argument("-o", "--output", metavar="OUT.json", required=True, help="the merged report")

    export = sub.add_parser("export", help="write the HTML report, Markdown, OpenMetrics, benchmark JSON, "
                                           "Bencher JSON or the GitHub job summary from a JSON report")
    export.add_argument("--report", metavar="REPORT.json", required=True, nargs="+",
                        help="the JSON report (several are merged first)")
    export.add_argument("--html", metavar="FILE.html", help="self-contained HTML report with memory plots")
    export.add_argument("--markdown", metavar="FILE.md", help="the Markdown report")
    export.add_argument("--openmetrics", metavar="FILE.txt", help="GitLab metrics report (OpenMetrics text)")
    export.add_argument("--benchmark-json", metavar="FILE.json",
                        help="github-action-benchmark customSmallerIsBetter JSON (memory and time metrics)")
    export.add_argument("--benchmark-json-bigger", metavar="FILE.json",
                        help="github-action-benchmark customBiggerIsBetter JSON (throughput)")
    export.add_argument("--pytest-benchmark", metavar="FILE.json",
                        help="pytest-benchmark's JSON (memory and time metrics), for pytest-benchmark compare")
    export.add_argument("--bencher", metavar="FILE.json", help="Bencher Metric Format JSON")
    export.add_argument("--device-class", metavar="NAME", help="the device class to export to Bencher when the "
                                                               "report holds several")
    export.add_argument("--github-summary", action="store_true", help="append the Markdown report to "
                                                                      "$GITHUB_STEP_SUMMARY")
    export.add_argument("--artifact-url", metavar="URL", help="link to the full report in the Markdown")


def _add_compare_command(sub) -> None:
    compare = sub.add_parser(
        "compare", help="judge the items of one report against another's (a version bump, a bisect); no baselines",
        description="Judge every item of AFTER against the same item in BEFORE with the rules AFTER ran with, "
                    "as against a baseline: print the verdict table, exit 1 on a regression. Software versions "
                    "that differ are compared across and named; a device class, GPU, profile or workload "
                    "definition that differs makes the item incomparable.")
    compare.add_argument("before", metavar="BEFORE.json", help="the earlier run's JSON report")
    compare.add_argument("after", metavar="AFTER.json", help="the later run's JSON report")
    compare.add_argument("--markdown", metavar="FILE.md", help="write the comparison as the Markdown report")
    compare.add_argument("--html", metavar="FILE.html", help="write the comparison as the HTML report")
    compare.add_argument("--report", metavar="FILE.json", help="write the comparison as a JSON report")


def _run_compare(ns) -> int:
    from .compare import compare
    from .errors import UsageError
    from .reports import exports, terminal
    from .reports.report import Report

    try:
        result = compare(Report.load(ns.before), Report.load(ns.after), ns.before)
    except UsageError as e:
        return _error(str(e))
    print("\n".join(terminal.table(result)))
    if ns.report:
        result.write_json(ns.report)
    exports.write(result, markdown=ns.markdown, html=ns.html)
    return 1 if result.failed else 0


def _load_reports(paths: list[str]):
    from .errors import UsageError
    from .reports.report import Report, merge

    files = []
    for path in paths:
        files += sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
    if not files:
        raise UsageError(f"no *.json report in {', '.join(paths)}")
    reports = [Report.load(f) for f in files]
    merged, replaced = merge(reports) if len(reports) > 1 else (reports[0], [])
    return merged, replaced, len(files)


def _run_report_command(ns) -> int:
    from .errors import UsageError
    from .publish import Options, PublishError, publish

    try:
        report, replaced, count = _load_reports(ns.reports if ns.command == "merge" else ns.report)
        for line in replaced:
            print(f"memcheck merge: {line}", file=sys.stderr)
        if ns.command == "merge":
            report.write_json(ns.output)
            print(f"memcheck merge: merged {count} reports ({len(report.items)} items) into {ns.output}")
            return 0
        if ns.command == "export":
            from .reports import exports

            written = exports.write(report, html=ns.html, markdown=ns.markdown, openmetrics_path=ns.openmetrics,
                                    benchmark=ns.benchmark_json, benchmark_bigger=ns.benchmark_json_bigger,
                                    bencher_path=ns.bencher, bencher_device_class=ns.device_class,
                                    step_summary=ns.github_summary, artifact_url=ns.artifact_url,
                                    pytest_benchmark_path=ns.pytest_benchmark)
            if ns.github_summary and not os.environ.get("GITHUB_STEP_SUMMARY"):
                return _error("--github-summary: GITHUB_STEP_SUMMARY is not set (not in a GitHub Actions job)")
            print("memcheck export: wrote " + (", ".join(written) if written else "nothing (no format chosen)"))
            return 0
        opts = Options(ns.platform, ns.api_url, ns.project, ns.mr, ns.repo, ns.pr, ns.event_path, ns.token_env,
                       ns.artifact_url)
        print(publish(report, opts, dry_run=ns.dry_run))
        return 0
    except UsageError as e:
        return _error(str(e))
    except PublishError as e:
        print(f"memcheck comment: error: {e}", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="memcheck", description="Memory regression checks for LLM inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run workloads and gate them against baselines (pytest --memcheck)")
    _common(run)
    run.add_argument("--strict", action="store_true", help="fail items without a baseline")
    run.add_argument("--durations", metavar="N", type=int, nargs="?", const=0,
                     help="print where each item's time went per phase (the N slowest items; all without N)")
    run.add_argument("-n", metavar="N", dest="workers",
                     help="measure N items at once (pytest-xdist; on a GPU, as many as its memory holds: time metrics are "
                          "then under contention)")
    baseline = sub.add_parser("baseline", help="manage baselines")
    bsub = baseline.add_subparsers(dest="action", required=True)
    refresh = bsub.add_parser("refresh", help="run workloads and write their baselines, printing what changed")
    _common(refresh)
    _add_report_commands(sub)
    _add_compare_command(sub)
    sub.add_parser("schema", help="print the JSON Schema of workload files (for editors and check-jsonschema)")
    from .bisect.command import add_arguments as bisect_arguments

    bisect_arguments(sub.add_parser("bisect", help="find the release or commit that made an item regress"))
    sub.add_parser("metrics", help="print the metric catalog: every name a baseline stores, its unit and meaning")
    check = sub.add_parser("check", help="load every workload file as pytest would, under each profile it names, "
                                         "and list the errors (file:line: field: message); runs nothing")
    check.add_argument("paths", nargs="*", help="workload files or folders (default: the project's suites)")
    ns = parser.parse_args(argv)
    if ns.command == "compare":
        return _run_compare(ns)
    if ns.command in ("comment", "merge", "export"):
        return _run_report_command(ns)
    if ns.command == "check":
        from .check import check

        errors, loaded = check(ns.paths)
        for line in errors:
            print(line, file=sys.stderr)
        print(f"memcheck check: {loaded} workloads, {len(errors)} error{'s' * (len(errors) != 1)}")
        return 1 if errors else 0
    if ns.command == "bisect":
        from .bisect.command import main as bisect

        return bisect(ns)
    if ns.command == "metrics":
        from .metrics.catalog import markdown_table

        sys.stdout.write(markdown_table())
        return 0
    if ns.command == "schema":
        from .workload import schema_text

        sys.stdout.write(schema_text())
        return 0
    args = _forward(ns)
    if ns.command == "run":
        args += ["--memcheck-strict"] if ns.strict else []
        args += [] if ns.durations is None else ["--memcheck-durations", str(ns.durations)]
        if ns.workers:
            import importlib.util

            if importlib.util.find_spec("xdist") is None:
                return _error("-n needs pytest-xdist: pip install 'memcheck[parallel]' (or pytest-xdist)")
            args += ["-n", ns.workers, "--dist", "worksteal"]  # a long item never waits behind a queue of others
        return _pytest(args)
    return _pytest(args + ["--memcheck-update-baselines"])


if __name__ == "__main__":
    sys.exit(main())
