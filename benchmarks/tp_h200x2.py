"""Tensor parallelism on two H200s, in one device call (nvidia-h200-x2, NCCL with NVLink multicast off): the
suites' tensor-parallel items and their tensor_parallel 1 twins on the paged stack, twice, through
`pytest --memcheck` as a user runs them.

    PYTHONUNBUFFERED=1 python benchmarks/tp_h200x2.py --out $OUT            # 2 GPUs, full profile
    python benchmarks/tp_h200x2.py --device cpu --out /tmp/tp               # gloo, ci profile: the CPU proof

Items: r1-32k and r1-32k-tp2 (suites/r1_long_context.yaml), v2-lite-mixed and v2-lite-mixed-tp2
(suites/v2_moe.yaml). First each TP 2 item's rank slices (each drawn on its own device) are checked against its
model built whole, bit for bit. Run 1 writes baselines into OUT/baselines (the project's store layout: a tensor-parallel
item on GPUs under `<gpu class>-x2/`, e.g. nvidia-h200-x2/r1-32k-tp2/paged.json; its tensor_parallel 1 twin under
nvidia-h200/); run 2 is gated against them. On CUDA the timed rounds only (--memcheck-no-host-heap: the tracemalloc
memory round would double the time; --host-heap keeps it). Writes OUT/tp_h200x2.json, the two JSON reports and
the pytest logs, and prints a table last: per rank at TP 2 against TP 1, the peak (gpu.heap_alloc.peak; on the CPU
cpu.heap_alloc.peak), weights, KV (kv.bytes.peak) and declared workspace, their ratio (goal: peak <= 0.55x on the
R1 item; MLA's latent cache is whole on every rank, so V2-Lite's KV does not halve), and whether run 1 and run 2
repeat within 0.5% on every memory metric of every rank. Commit OUT/baselines/nvidia-h200-x2/ (and the TP 1 files
under nvidia-h200/ where none exist) as baselines/.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.memcheck_pytest import plugin_args  # noqa: E402
SUITES = ("suites/r1_long_context.yaml", "suites/v2_moe.yaml")
PAIRS = (("r1-32k", "r1-32k-tp2"), ("v2-lite-mixed", "v2-lite-mixed-tp2"))
GOAL = 0.55  # per-rank peak at TP 2 over TP 1, R1 (the design's goal)
REPEAT = 0.005  # run 1 vs run 2, every memory metric of every rank
TIMES = ("tpot", "ttft", "time.wall", "time.warmup")
MEMORY = ("gpu.heap_alloc.peak", "gpu.reserved.peak", "gpu.device_used.peak", "gpu.heap_alloc.end",
          "cpu.heap_alloc.peak", "kv.bytes.peak", "kv.live_bytes.peak")


def run(out: Path, tag: str, args, update: bool) -> dict:
    report = out / f"report-{tag}.json"
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-q", "--memcheck",
           *SUITES, "-k", _select(), "--memcheck-profile", args.profile, "--memcheck-device", args.device,
           "--memcheck-baselines", str(out / "baselines"), "--memcheck-report", str(report)]
    if update:
        cmd.append("--memcheck-update-baselines")
    if not args.host_heap:
        cmd.append("--memcheck-no-host-heap")
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.time()
    with open(out / f"pytest-{tag}.log", "w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    print((out / f"pytest-{tag}.log").read_text()[-2500:], flush=True)
    print(f"[{tag}] pytest exit {code} in {time.time() - t0:.0f} s", flush=True)
    if not report.exists():
        raise SystemExit(f"[{tag}] no report ({report}): see {out / f'pytest-{tag}.log'}")
    return {item["workload"]: item for item in json.loads(report.read_text())["items"]}


def _select() -> str:
    """pytest -k: the paged items of the pairs (the workload names are substrings of their TP 2 twins')."""
    return "(" + " or ".join(a for a, _ in PAIRS) + ") and paged and not flash"


def check_weights(args) -> dict:
    """Each TP 2 item's model: both ranks' slices, drawn on their own devices, against the model built whole on
    the first (tensor_parallel 1), tensor by tensor, bit for bit. {workload: mismatching tensor names}."""
    import torch

    from memcheck import project, stacks, workload
    from memcheck.models import build_hf_model
    from memcheck.stacks.paged.config import ModelSpec
    from memcheck.stacks.paged.model import CausalLM
    from tests.tp.test_tp_shards import rank_model, reassembled

    devices = ["cpu", "cpu"] if args.device == "cpu" else ["cuda:0", "cuda:1"]
    out = {}
    for path, (_, name) in zip(SUITES, PAIRS):
        wl = next(w for w in workload.load_file(str(ROOT / path), args.profile, stacks.names(),
                                                project.load(ROOT).thresholds) if w.name == name)
        t0 = time.time()
        hf = build_hf_model(wl, devices[0])
        spec = ModelSpec.from_hf(hf.config)
        whole = CausalLM.from_hf(hf, spec).state_dict()
        del hf
        ranks = [rank_model(wl, spec, r, 2, devices[r])[0] for r in range(2)]
        out[name] = [k for k, full in whole.items()
                     if not torch.equal(reassembled(k, [s[k].to(full.device) for s in ranks], full), full)]
        print(f"weights of {name}: {len(whole) - len(out[name])} of {len(whole)} tensors equal tensor_parallel 1's "
              f"({time.time() - t0:.0f} s)", flush=True)
        del whole, ranks
        if args.device != "cpu":
            torch.cuda.empty_cache()
    return out


def per_rank(item: dict, metric: str) -> list:
    """The metric of each rank (one entry at tensor_parallel 1)."""
    if item.get("ranks"):
        return [r["metrics"].get(metric) for r in item["ranks"]]
    return [(item["metrics"].get(metric) or {}).get("value")]


def ratio(a, b):
    return None if a is None or not b else a / b


def fmt(n) -> str:
    return "-" if n is None else f"{n / 2**30:.3f} GiB" if n >= 2**28 else f"{n / 2**20:.2f} MiB"


def compare(runs: list[dict], peak_metric: str) -> dict:
    first = runs[0]
    summary = {}
    for tp1, tp2 in PAIRS:
        a, b = first.get(tp1), first.get(tp2)
        row = {"tp1": tp1, "tp2": tp2, "verdicts": [[r.get(n, {}).get("verdict") for n in (tp1, tp2)] for r in runs]}
        if not a or not b or a.get("error") or b.get("error") or a.get("skipped") or b.get("skipped"):
            row["error"] = {n: (x or {}).get("error") or (x or {}).get("skipped") or "not run"
                            for n, x in ((tp1, a), (tp2, b))}
            summary[tp2] = row
            continue
        kv1, kv2 = per_rank(a, "kv.bytes.peak")[0], max(per_rank(b, "kv.bytes.peak"))
        peak1, peak2 = per_rank(a, peak_metric)[0], max(v for v in per_rank(b, peak_metric) if v is not None)
        row.update({
            "peak": [peak1, per_rank(b, peak_metric)], "peak_ratio": ratio(peak2, peak1),
            "weights": [a["floors"].get("weights"), b["floors"].get("weights")],
            "weights_ratio": ratio(b["floors"].get("weights"), a["floors"].get("weights")),
            "kv": [kv1, per_rank(b, "kv.bytes.peak")], "kv_ratio": ratio(kv2, kv1),
            "workspace": [a["floors"].get("workspace"), b["floors"].get("workspace")],
            "workspace_ratio": ratio(b["floors"].get("workspace"), a["floors"].get("workspace")),
            "replicated": next((n for n in b["notes"] if n.startswith("replicated on every rank")), None),
            # speed beside memory: the maximum across ranks (the item's value), seconds
            "time": {m: [(x["metrics"].get(m) or {}).get("value") for x in (a, b)] for m in TIMES},
        })
        spread = {}
        for name in (tp1, tp2):
            for metric in MEMORY:
                for rank, values in enumerate(zip(*(per_rank(r[name], metric) for r in runs if name in r))):
                    if len(values) > 1 and None not in values and max(values):
                        spread[f"{name} rank {rank} {metric}"] = (max(values) - min(values)) / max(values)
        row["repeat_worst"] = max(spread.items(), key=lambda kv: kv[1]) if spread else None
        row["repeats"] = bool(spread) and all(v <= REPEAT for v in spread.values())
        summary[tp2] = row
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (NCCL, one GPU per rank) or cpu (gloo)")
    p.add_argument("--profile", default=None, help="workload profile (default: full on cuda, ci on cpu)")
    p.add_argument("--out", default=os.environ.get("OUT") or "tp-out")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--host-heap", action="store_true", help="keep the memory round (host.heap_alloc.peak)")
    p.add_argument("--no-weights-check", action="store_true", help="skip the bit-for-bit check of the rank slices")
    args = p.parse_args()
    args.profile = args.profile or ("ci" if args.device == "cpu" else "full")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.device != "cpu":
        import torch

        print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    t0 = time.time()
    mismatches = {} if args.no_weights_check else check_weights(args)
    runs = [run(out, f"run{i + 1}", args, update=i == 0) for i in range(args.runs)]
    peak_metric = "cpu.heap_alloc.peak" if args.device == "cpu" else "gpu.heap_alloc.peak"
    summary = compare(runs, peak_metric)
    result = {"device": args.device, "profile": args.profile, "peak_metric": peak_metric, "runs": args.runs,
              "seconds": round(time.time() - t0), "pairs": summary, "weights_mismatching_tp1": mismatches}
    (out / "tp_h200x2.json").write_text(json.dumps(result, indent=1))
    print(f"\nper rank at tensor_parallel 2 vs 1 ({args.device}, profile {args.profile}, {args.runs} runs, "
          f"{result['seconds']} s); peak = {peak_metric}; baselines in {out / 'baselines'}")
    print(f"{'item':<20} {'what':<10} {'TP 1':>12} {'TP 2 per rank':>27} {'ratio':>6}")
    for tp2, row in summary.items():
        if "error" in row:
            print(f"{tp2:<20} error: {row['error']}")
            continue
        for what in ("peak", "weights", "kv", "workspace"):
            one, two = row[what]
            two = two if isinstance(two, list) else [two]
            r = row[f"{what}_ratio"]
            mark = (" (goal <= 0.55)" if r is not None and r <= GOAL else " (goal NOT met)") \
                if what == "peak" and tp2.startswith("r1") else ""
            print(f"{tp2:<20} {what:<10} {fmt(one):>12} {' / '.join(fmt(v) for v in two):>27} "
                  f"{'-' if r is None else f'{r:.3f}':>6}{mark}")
        print(f"{tp2:<20} {'seconds':<10} " + ", ".join(
            f"{m} {'/'.join('-' if v is None else f'{v:.4g}' for v in row['time'][m])}" for m in TIMES)
            + " (TP 1/TP 2)")
        worst = row["repeat_worst"]
        repeats = "not checked (one run)" if len(row["verdicts"]) < 2 else "yes" if row["repeats"] else "NO"
        print(f"{tp2:<20} runs repeat within 0.5%: {repeats}"
              + (f" (worst {worst[0]}: {worst[1] * 100:.3f}%)" if worst else "")
              + f"; verdicts {row['verdicts']}")
        bad = mismatches.get(tp2)
        same = "not checked" if bad is None else "yes" if not bad else f"NO ({bad[:5]})"
        print(f"{tp2:<20} rank slices equal tensor_parallel 1's weights: {same}")
    return 0 if all("error" not in r for r in summary.values()) and not any(mismatches.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
