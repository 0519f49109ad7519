"""The same two regressions injected into the paged engine (benchmarks/workloads/leakystack.py), judged by a
prediction on a CPU runner and by a measurement on the GPU: the verdicts must agree.

    python benchmarks/predict_leaks.py OUT --predict nvidia-h200                 # on a CPU runner
    PYTHONPATH=. python benchmarks/predict_leaks.py OUT --predict nvidia-h200 --device cuda  # on the H200: both

A throwaway project in OUT/leaks-LABEL (the leaky stack installed as a plugin, one workload: R1-Distill-Qwen-7B's layers at
their published size, 4 of them, 8 requests of 1024 + 64 tokens) is run four times: the baseline recorded, the
same code again, a 512 KiB device buffer kept per engine step, a finished sequence's blocks never handed back.
Prints one row per case: its verdict, the metrics that regressed, the heap peak and blocks unreclaimed; with both
--predict and --device, the two verdicts side by side and whether they agree."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.memcheck_pytest import plugin_args  # noqa: E402
from memcheck.reports.terminal import aligned  # noqa: E402
WORKLOAD = """\
name: leaks
model: {preset: r1-distill-qwen-7b, layers: 4}
requests: [{count: 8, prompt_tokens: 1024, max_new_tokens: 64}]
stacks: [leaky]
"""
CASES = (("baseline recorded", {}, ["--memcheck-update-baselines"]), ("unchanged", {}, []),
         ("buffer kept per step", {"LEAK_KIB_PER_STEP": "512"}, []), ("blocks not freed", {"LEAK_BLOCKS": "1"}, []))


def project(out: Path) -> tuple[Path, dict]:
    if out.exists():
        shutil.rmtree(out)
    site = out / "site"
    info = site / "leakystack-1.0.dist-info"
    info.mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "workloads" / "leakystack.py", site / "leakystack.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leakystack\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[memcheck.stacks]\nleaky = leakystack:LeakyPaged\n")
    (out / "pyproject.toml").write_text("[tool.memcheck]\n")
    (out / "suites").mkdir()
    (out / "suites" / "leaks.yaml").write_text(WORKLOAD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    for name in ("LEAK_KIB_PER_STEP", "LEAK_BLOCKS"):
        env.pop(name, None)
    return out, env


def run_cases(out: Path, predict: str | None, device: str | None) -> list[tuple]:
    """The four cases, predicted (predict: GPU) or measured (device): (case, verdict, exit, regressed, heap MiB,
    blocks unreclaimed, seconds) each."""
    label = "predicted" if predict else "measured"
    where, env = project(out / f"leaks-{label}")
    mode = ["--memcheck-predict", predict] if predict else ["--memcheck-device", device, "--memcheck-profile", "full"]
    heap = "predicted.gpu.heap_alloc.peak" if predict else "gpu.heap_alloc.peak"
    rows = []
    for case, extra_env, flags in CASES:
        report = where / f"{len(rows)}.json"
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-q", "--memcheck", *mode,
                               "--memcheck-report", str(report), *flags], cwd=where, env={**env, **extra_env},
                              capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if not report.exists():
            raise SystemExit(f"{label} {case}: no report\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        item = json.loads(report.read_text())["items"][0]
        failing = [c["metric"] for c in item["checks"] if c["status"] == "regressed"]
        value = lambda name: (item["metrics"].get(name) or {}).get("value")  # noqa: E731
        peak = value(heap)
        rows.append((case, item["verdict"], f"exit {done.returncode}", ", ".join(failing) or "-",
                     "-" if peak is None else f"{peak / 2**20:.1f}", str(value("kv.blocks_unreclaimed")),
                     f"{seconds:.0f}"))
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--predict", metavar="GPU", help="predict on this runner for GPU (nvidia-h200)")
    p.add_argument("--device", metavar="DEVICE", help="measure on DEVICE (cuda); with --predict too, one table of both")
    args = p.parse_args()
    if not (args.predict or args.device):
        p.error("give --predict GPU, --device DEVICE, or both")
    out = Path(args.out).resolve()
    what = " (leaks[leaky]: 4 layers of R1-Distill-Qwen-7B, 8 x (1024 + 64) tokens)"
    parts = {}
    if args.predict:
        parts["predicted"] = run_cases(out, args.predict, None)
    if args.device:
        parts["measured"] = run_cases(out, None, args.device)
    if len(parts) == 2:
        rows = [(p[0], p[1], m[1], p[3], m[3], p[4], m[4], "yes" if p[1] == m[1] else "NO")
                for p, m in zip(parts["predicted"], parts["measured"])]
        lines = [f"injected regressions, predicted for {args.predict} and measured on {args.device}{what}",
                 *aligned([("case", "predicted", "measured", "regressed (predicted)", "regressed (measured)",
                            "heap peak MiB (predicted)", "heap peak MiB (measured)", "agree"), *rows])]
        name = "predict_leaks_both.log"
    else:
        label, rows = next(iter(parts.items()))
        heap = "predicted.gpu.heap_alloc.peak" if label == "predicted" else "gpu.heap_alloc.peak"
        lines = [f"injected regressions, {label} " + (f"for {args.predict}" if args.predict else f"on {args.device}")
                 + what, *aligned([("case", "verdict", "pytest", "regressed", f"{heap} MiB", "kv.blocks_unreclaimed",
                                   "s"), *rows])]
        name = f"predict_leaks_{label}.log"
    text = "\n".join(lines) + "\n"
    (out / name).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
