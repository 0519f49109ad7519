"""Every command-line option of the pytest plugin, registered in one place with its help text."""
from __future__ import annotations


def register(parser) -> None:
    group = parser.getgroup("memcheck", "memory regression checks of LLM inference workloads")
    group.addoption("--memcheck", action="store_true", default=False,
                    help="collect YAML workloads under the given paths (default: the suites of [tool.memcheck], "
                         "else suites/) and gate their memory metrics against baselines")
    group.addoption("--memcheck-baselines", metavar="DIR", default=None,
                    help="baseline folder (default: [tool.memcheck] baselines, else baselines/)")
    group.addoption("--memcheck-update-baselines", action="store_true", default=False,
                    help="write or refresh the baselines of the items that ran")
    group.addoption("--memcheck-report", metavar="FILE.json", default=None,
                    help="write the machine-readable report (read by `memcheck comment` and `memcheck merge`)")
    group.addoption("--memcheck-markdown", metavar="FILE.md", default=None,
                    help="write the Markdown report (the merge-request comment body)")
    group.addoption("--memcheck-strict", action="store_true", default=False,
                    help="fail items that have no baseline yet")
    group.addoption("--memcheck-profile", metavar="NAME", default=None,
                    help="workload profile to run (default: ci on a CPU runner, full on a GPU runner)")
    group.addoption("--memcheck-device", metavar="DEVICE", default="auto",
                    help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    group.addoption("--memcheck-predict", metavar="GPU", default=None,
                    help="predict the GPU memory of the workloads for GPU (nvidia-h200) on this CPU runner instead of "
                         "measuring: fake CUDA tensors, the caching allocator modelled; predicted.gpu.* metrics, "
                         "judged against baselines/GPU-predicted (default profile: full)")
    group.addoption("--memcheck-timeout", metavar="SECONDS", type=float, default=None,
                    help="give up on one item's round after this many seconds (an error verdict)")
    group.addoption("--memcheck-durations", metavar="N", type=int, default=None,
                    help="print where each item's time went per phase (startup, build, run, teardown, exit, report): "
                         "the N slowest items, 0 for all")
    group.addoption("--memcheck-no-fork-server", action="store_true", default=False,
                    help="start every round in a fresh interpreter instead of forking it from a server that "
                         "imported torch once (slower; the same isolation)")
    group.addoption("--memcheck-no-host-heap", action="store_true", default=False,
                    help="skip the heap round: the extra worker per item that measures host.heap_alloc.peak "
                         "under tracemalloc, off the timed rounds (host.heap_alloc.peak becomes null)")
    group.addoption("--memcheck-sample-period", metavar="MS", type=float, default=10.0,
                    help="NVML and allocator sampling period in milliseconds (default 10)")
    # Reports beside the JSON: the HTML page, dashboard exports, allocator snapshots (memcheck/reports/).
    group.addoption("--memcheck-html", metavar="FILE.html", default=None,
                    help="write the self-contained HTML report (memory-over-time plots, verdicts, environment)")
    group.addoption("--memcheck-openmetrics", metavar="FILE.txt", default=None,
                    help="write GitLab's metrics report (OpenMetrics text; artifacts:reports:metrics)")
    group.addoption("--memcheck-benchmark-json", metavar="FILE.json", default=None,
                    help="write github-action-benchmark customSmallerIsBetter JSON (memory and time metrics)")
    group.addoption("--memcheck-bencher", metavar="FILE.json", default=None,
                    help="write Bencher Metric Format JSON (bencher run --adapter json --file FILE.json)")
    group.addoption("--memcheck-no-step-summary", action="store_true", default=False,
                    help="do not append the Markdown report to $GITHUB_STEP_SUMMARY (written when it is set)")
    group.addoption("--memcheck-snapshots", metavar="DIR", default=None,
                    help="where the torch allocator snapshots of items that regressed on a CUDA runner go "
                         "(default: memcheck-snapshots/ beside --memcheck-report, else .memcheck/snapshots)")
