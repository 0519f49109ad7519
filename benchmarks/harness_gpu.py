"""Run workloads twice on a real GPU in one call through `pytest --memcheck` (record baselines, then
compare against them) and print, last, each memory metric of both runs and their difference: the
check that GPU memory metrics repeat (within 0.5%) before baselines are committed.

    PYTHONPATH=. python benchmarks/harness_gpu.py OUTDIR [PATHS...] [-- PYTEST_ARGS...]

Default PATHS: the harness's GPU smoke workloads. Run from the repository root on a CUDA machine
(the memcheck package need not be installed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.suites_h200 import repeat_rows, table
from memcheck import units

WORKLOADS = "benchmarks/workloads/harness_gpu.yaml"


def start(out: str, tag: str, paths: list[str], *extra: str) -> subprocess.Popen:
    report = os.path.join(out, f"report-{tag}.json")
    cmd = [sys.executable, "-m", "pytest", "-p", "memcheck.plugin", "-p", "no:cacheprovider", "--memcheck", *paths,
           "--memcheck-baselines", os.path.join(out, f"baselines-{tag}"), "--memcheck-report", report, *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    log = open(os.path.join(out, f"pytest-{tag}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    proc.tag, proc.report, proc.t0, proc.log = tag, report, time.time(), log
    return proc


def finish(proc: subprocess.Popen) -> dict:
    proc.wait()
    proc.log.close()
    with open(proc.log.name) as f:
        print(f.read()[-3000:], flush=True)
    print(f"[{proc.tag}] exit {proc.returncode} in {time.time() - proc.t0:.1f} s", flush=True)
    with open(proc.report) as f:
        return json.load(f)


def main() -> int:
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    out = args[0] if args else "harness-gpu-out"
    paths = args[1:] or [WORKLOADS]
    os.makedirs(out, exist_ok=True)
    if os.environ.get("CONCURRENT") == "1":
        # Both runs at once on the one GPU: memory metrics are per process (allocator stats, NVML per
        # pid), so they do not see each other; only the time metrics would, and they are not compared.
        a, b = (start(out, tag, paths, "--memcheck-update-baselines", *extra) for tag in ("run1", "run2"))
        first, second = finish(a), finish(b)
    else:
        first = finish(start(out, "run1", paths, "--memcheck-update-baselines", *extra))
        second = finish(start(out, "run2", paths, "--memcheck-update-baselines", *extra))
    rows, worst = repeat_rows(first, second)  # every memory metric of both runs
    print("\n" + table(rows))
    items = [("item", "verdict", "gpu.device_used.peak source", "floors (analytic)")]
    for b in second["items"]:
        if b["verdict"] in ("skipped", "error"):
            items.append((b["id"], b["verdict"], (b["reason"] or "")[:100], ""))
            continue
        m, floors = b["metrics"]["gpu.device_used.peak"], b["floors"]
        items.append((b["id"], b["verdict"], m.get("detail") or m.get("reason") or "",
                      f"weights {units.format_bytes(floors.get('weights'))}, kv {units.format_bytes(floors.get('kv'))}"))
    print("\n" + table(items))
    print("environment:", json.dumps(second["environment"]))
    print(f"largest run-to-run difference of a gpu.*/kv.* metric: {worst * 100:.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
