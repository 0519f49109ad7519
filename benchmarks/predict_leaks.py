"""The same two regressions injected into the paged engine (benchmarks/workloads/leakystack.py), judged by a
prediction on a CPU runner and by a measurement on the GPU: the verdicts must agree.

    python benchmarks/predict_leaks.py OUT --predict nvidia-h200                 # on a CPU runner
    PYTHONPATH=. python benchmarks/predict_leaks.py OUT --predict nvidia-h200 --device cuda  # on the H200: both
    python benchmarks/predict_leaks.py OUT --join PREDICTED.log MEASURED.log     # one table of two runs made apart

A throwaway project in OUT/leaks-LABEL (the leaky stack installed as a plugin, one workload: R1-Distill-Qwen-7B's layers at
their published size, 4 of them, 8 requests of 1024 + 64 tokens) is run four times: the baseline recorded, the
same code again, a 512 KiB device buffer kept per engine step, a finished sequence's blocks never handed back.
Prints one row per case: its verdict, the metrics that regressed, the heap peak and blocks unreclaimed; with both
--predict and --device, the two verdicts side by side and whether they agree."""
import argparse
import json
import os
import re
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
CASE_S = 150  # one case's pytest at most: a hung one ends with its log's tail rather than the whole call's limit


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
        log = report.with_suffix(".log")
        with log.open("w") as f:
            try:
                code = subprocess.call([sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-q",
                                        "--memcheck", *mode, "--memcheck-report", str(report), *flags], cwd=where,
                                       env={**env, **extra_env}, stdout=f, stderr=subprocess.STDOUT, timeout=CASE_S)
            except subprocess.TimeoutExpired:
                code = f"killed after {CASE_S} s"
        seconds = time.perf_counter() - t0
        print(f"[{label} {case}] pytest exit {code} in {seconds:.0f} s ({log})", flush=True)
        if not report.exists():
            raise SystemExit(f"{label} {case}: no report\n{log.read_text()[-4000:]}")
        item = json.loads(report.read_text())["items"][0]
        failing = [c["metric"] for c in item["checks"] if c["status"] == "regressed"]
        value = lambda name: (item["metrics"].get(name) or {}).get("value")  # noqa: E731
        peak = value(heap)
        rows.append((case, item["verdict"], f"exit {code}", ", ".join(failing) or "-",
                     "-" if peak is None else f"{peak / 2**20:.1f}", str(value("kv.blocks_unreclaimed")),
                     f"{seconds:.0f}"))
    return rows


WHAT = " (leaks[leaky]: 4 layers of R1-Distill-Qwen-7B, 8 x (1024 + 64) tokens)"


def both_table(predicted_for: str, measured_on: str, predicted: list, measured: list) -> list[str]:
    """The two runs' verdicts side by side, and whether they agree."""
    rows = [(p[0], p[1], m[1], p[3], m[3], p[4], m[4], "yes" if p[1] == m[1] else "NO")
            for p, m in zip(predicted, measured)]
    return [f"injected regressions, predicted for {predicted_for} and measured on {measured_on}{WHAT}",
            *aligned([("case", "predicted", "measured", "regressed (predicted)", "regressed (measured)",
                       "heap peak MiB (predicted)", "heap peak MiB (measured)", "agree"), *rows])]


def read_table(log: Path) -> tuple[str, list]:
    """A one-sided table this script wrote: where it ran (its heading's words before the workload) and its rows."""
    try:
        lines = log.read_text().splitlines()
    except OSError as e:
        raise SystemExit(f"{log}: {e.strerror}") from None
    heading = next((i for i, line in enumerate(lines) if line.startswith("injected regressions, ")), None)
    if heading is None:
        raise SystemExit(f"{log}: no table of this script (no line starting 'injected regressions, ')")
    where = lines[heading].removeprefix("injected regressions, ").removesuffix(WHAT)
    rows = [tuple(re.split(r"\s{2,}", line.strip())) for line in lines[heading + 3:] if line.strip()]
    if len(rows) != len(CASES) or any(len(row) != 7 for row in rows):
        raise SystemExit(f"{log}: not a one-sided table of this script ({len(rows)} rows)")
    return where, rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--predict", metavar="GPU", help="predict on this runner for GPU (nvidia-h200)")
    p.add_argument("--device", metavar="DEVICE", help="measure on DEVICE (cuda); with --predict too, one table of both")
    p.add_argument("--join", nargs=2, metavar=("PREDICTED_LOG", "MEASURED_LOG"), type=Path,
                   help="no run: one table of both from the logs of a prediction and a measurement made apart (a CPU "
                        "runner's and a GPU machine's)")
    args = p.parse_args()
    if not (args.predict or args.device or args.join):
        p.error("give --predict GPU, --device DEVICE, both, or --join")
    out = Path(args.out).resolve()
    if args.join:
        (predicted_for, predicted), (measured_on, measured) = (read_table(log) for log in args.join)
        lines = both_table(f"{predicted_for.removeprefix('predicted for ')} ({args.join[0].name})",
                           f"{measured_on.removeprefix('measured on ')} ({args.join[1].name})", predicted, measured)
        name = "predict_leaks_both.log"
    else:
        parts = {}
        if args.predict:
            parts["predicted"] = run_cases(out, args.predict, None)
        if args.device:
            parts["measured"] = run_cases(out, None, args.device)
        if len(parts) == 2:
            lines = both_table(args.predict, args.device, parts["predicted"], parts["measured"])
            name = "predict_leaks_both.log"
        else:
            label, rows = next(iter(parts.items()))
            heap = "predicted.gpu.heap_alloc.peak" if label == "predicted" else "gpu.heap_alloc.peak"
            lines = [f"injected regressions, {label} " + (f"for {args.predict}" if args.predict else f"on {args.device}")
                     + WHAT, *aligned([("case", "verdict", "pytest", "regressed", f"{heap} MiB",
                                        "kv.blocks_unreclaimed", "s"), *rows])]
            name = f"predict_leaks_{label}.log"
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
