"""How close a prediction on this CPU comes to the H200: every single-GPU suite item predicted at its full profile
(`memcheck run --predict nvidia-h200`), beside the committed baselines/nvidia-h200 measurement of the same item.

    python benchmarks/predict_accuracy.py OUT_DIR [-k EXPR]

Prints one row per item (measured, predicted and their difference for gpu.heap_alloc.peak and gpu.reserved.peak;
the seconds the prediction took, from the worker's start to its end) and writes OUT_DIR/predict_accuracy.log
for benchmarks/results_md.py. Items that cannot be predicted are listed with their reason."""
import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAIRS = (("gpu.heap_alloc.peak", "predicted.gpu.heap_alloc.peak"), ("gpu.reserved.peak", "predicted.gpu.reserved.peak"))


def measured(item: dict) -> dict | None:
    path = ROOT / "baselines" / "nvidia-h200" / item["workload"] / f"{item['stack'].replace(':', '+')}.json"
    return json.loads(path.read_text())["metrics"] if path.exists() else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("-k", default=None, help="only items matching, as pytest -k")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from memcheck.cli import main as memcheck
    from memcheck.reports.terminal import aligned

    report = out / "predict.json"
    t0 = time.perf_counter()
    memcheck(["run", "--predict", "nvidia-h200", "--report", str(report), "--baselines", str(out / "baselines"),
              *(["-k", args.k] if args.k else [])])
    wall = time.perf_counter() - t0
    items = json.loads(report.read_text())["items"]
    rows, skipped, worst = [], [], (0.0, "")
    for it in items:
        if it["skipped"] or it["error"]:
            skipped.append(f"{it['id']}: {it['skipped'] or it['error']['message'][:160]}")
            continue
        base = measured(it)
        seconds = sum(it["phases"].values())
        cells = []
        for truth_name, predicted_name in PAIRS:
            truth = (base or {}).get(truth_name, {}).get("value")
            guess = it["metrics"][predicted_name]["value"]
            diff = None if not truth else (guess - truth) / truth * 100
            if diff is not None and abs(diff) > abs(worst[0]):
                worst = (diff, f"{it['id']} {truth_name}")
            cells += [f"{truth / 2**30:.3f}" if truth else "-", f"{guess / 2**30:.3f}",
                      f"{diff:+.3f}%" if diff is not None else "no H200 baseline"]
        rows.append((it["id"], *cells, f"{seconds:.1f}"))
    header = ("item", "heap GiB H200", "heap GiB predicted", "diff", "reserved GiB H200", "reserved GiB predicted",
              "diff", "s")
    lines = [f"predicted on this CPU for nvidia-h200 vs measured on the H200 (baselines/nvidia-h200); largest miss "
             f"{worst[0]:+.3f}% ({worst[1]}); {len(rows)} items in {wall:.0f} s", *aligned([header, *rows])]
    text = "\n".join([*(f"not predicted: {s}" for s in skipped), "", *lines]) + "\n"
    (out / "predict_accuracy.log").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
