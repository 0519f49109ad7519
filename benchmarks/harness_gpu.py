"""Check the harness's GPU collectors on a real GPU in one call: run the GPU smoke workloads twice
through `pytest --memcheck` (record, then compare), and print what a reviewer needs last.

    PYTHONPATH=. python benchmarks/harness_gpu.py OUTDIR

Run from the repository root on a CUDA machine (the memcheck package need not be installed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from harness import units

WORKLOADS = "benchmarks/workloads/harness_gpu.yaml"
SHOWN = ("gpu.heap_alloc.peak", "gpu.reserved.peak", "gpu.device_used.peak", "gpu.fragmentation.peak",
         "gpu.heap_alloc.end", "kv.bytes.peak", "kv.page_footprint", "host.rss.peak")


def session(out: str, tag: str, *extra: str) -> dict:
    report = os.path.join(out, f"report-{tag}.json")
    cmd = [sys.executable, "-m", "pytest", "-p", "harness.plugin", "-p", "no:cacheprovider", "--memcheck", WORKLOADS,
           "--memcheck-baselines", os.path.join(out, "baselines"), "--memcheck-report", report, *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n", flush=True)
    print(f"[{tag}] exit {proc.returncode} in {time.time() - t:.1f} s", flush=True)
    with open(report) as f:
        return json.load(f)


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "harness-gpu-out"
    os.makedirs(out, exist_ok=True)
    first = session(out, "record", "--memcheck-update-baselines")
    second = session(out, "compare")
    rows = [("item", "verdict", "metric", "run 1", "run 2", "diff")]
    for a, b in zip(first["items"], second["items"]):
        for name in SHOWN:
            va, vb = a["metrics"][name]["value"], b["metrics"][name]["value"]
            unit = "ratio" if "fragmentation" in name else ("count" if "footprint" in name else "bytes")
            diff = "" if va is None or vb is None or not va else units.format_percent((vb - va) / va)
            rows.append((a["id"], b["verdict"], name, units.format_value(va, unit), units.format_value(vb, unit), diff))
        for name in ("gpu.device_used.peak", "host.dtlb_misses"):
            m = b["metrics"][name]
            rows.append((a["id"], "", f"{name} source", m.get("detail") or m.get("reason") or "", "", ""))
        floors = b["floors"]
        rows.append((a["id"], "", "floors (analytic)", f"weights {units.format_bytes(floors.get('weights'))}",
                     f"kv {units.format_bytes(floors.get('kv'))}", ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    print("\n" + "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows))
    print("environment:", json.dumps(second["environment"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
