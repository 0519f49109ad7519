"""The full profile of the three suites on one GPU, one `pytest --memcheck` per suite (or part of one), each with
its own report, merged into OUT/RUN/merged.json by `memcheck merge`: the run that records a GPU runner's
baselines, and the run that checks them. Prints, last, each item's verdict, where its time went and its numbers.

    PYTHONPATH=. python benchmarks/suites_h200.py OUT --run run1 --update [--suites vl,v2,r1-long,r1-batch,v2-paged]
    PYTHONPATH=. python benchmarks/suites_h200.py OUT --run run2 [--suites ...] [--budget-s 560]
    PYTHONPATH=. python benchmarks/suites_h200.py OUT --run after --suites r1,vl-v2 --at-once 6 --cold-triton-cache \
        --against-baselines
    python benchmarks/suites_h200.py --compare RUN1 RUN2    # memory metrics run to run: reports or folders (no GPU)

A part starts only if its estimated time (ESTIMATE_S, or --estimates) fits in what is left of --budget-s, so
one call stays under the device's 10-minute limit; the parts left out are named, to run in the next call (the
same OUT and --run: its tables then cover the parts of both calls, each part's wall kept in RUN/seconds.json).
The two-GPU items (`-tp2`) are left out: they need a machine of two GPUs (benchmarks/tp_h200x2.py).

`--at-once N` measures N items at once on the GPU (`-n N --dist worksteal`, memcheck/device_share.py).
`--against-baselines` then prints every gpu.*/kv.* number and verdict beside the committed baseline's, and each
part's seconds beside BEFORE_S (the parts one at a time, one item at a time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.memcheck_pytest import plugin_args  # noqa: E402

# One pytest each: a suite, or a part of one (the R1 suite took 9.6 min before hf's memory round was folded into
# its warm-up, near one call's 10-minute limit; 5.8 min since). r1 and vl-v2 are the CI templates' GPU parts.
R1, VL, V2 = "suites/r1_long_context.yaml", "suites/deepseek_vl_mixed.yaml", "suites/v2_moe.yaml"
PARTS = {"vl": ((VL,), "not tp2"), "v2": ((V2,), "not tp2"),
         "r1-long": ((R1,), "(r1-32k or r1-64k or r1-128k) and not tp2"),
         "r1-batch": ((R1,), "r1-32x2k or r1-staggered"),
         "r1": ((R1,), "not tp2"), "vl-v2": ((VL, V2), "not tp2"),
         "v2-paged": ((V2,), "paged and not tp2")}  # our engine's V2 items alone: their baselines after a kernel change
# Seconds per part of the full profile one item at a time, measured on a fresh H200 against the committed baselines
# (the CI template's parts then); r1 and vl-v2 are their sums.
BEFORE_S = {"r1-long": 184, "r1-batch": 112, "v2": 160, "vl": 96}
BEFORE_S.update({"r1": BEFORE_S["r1-long"] + BEFORE_S["r1-batch"], "vl-v2": BEFORE_S["vl"] + BEFORE_S["v2"]})
# Seconds on an H200, a cold Triton cache, one item at a time, with about 10% to spare.
ESTIMATE_S = {"vl": 105, "v2": 140, "r1-long": 245, "r1-batch": 140, "r1": 385, "vl-v2": 245, "v2-paged": 90}
# Memory metrics that must repeat run to run (within 0.5%); time metrics are compared through rounds.
MEMORY = ("gpu.heap_alloc.peak", "gpu.heap_alloc.end", "gpu.reserved.peak", "gpu.device_used.peak",
          "gpu.fragmentation.peak", "kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak", "kv.page_footprint",
          "host.rss.peak", "host.heap_alloc.peak")


SECONDS: dict[str, float] = {}  # each part's wall, pytest's start to its exit (this call's, or an earlier call's)


def run_part(out: str, tag: str, key: str, update: bool, baselines: str | None, profile: str,
             at_once: int = 1, cold_triton_cache: bool = False) -> dict | None:
    """One suite (or part) through pytest --memcheck; its JSON report, or None if it wrote none. A cold Triton
    cache is a new empty folder for this part alone, as each CI job starts with its own."""
    os.makedirs(os.path.join(out, tag), exist_ok=True)
    report = os.path.join(out, tag, f"{key}.json")
    files, select = PARTS[key]
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-q", "--memcheck",
           *files, "-k", select, "--memcheck-profile", profile, "--memcheck-report", report,
           "--memcheck-markdown", os.path.join(out, tag, f"{key}.md"), "--memcheck-durations", "0"]
    if at_once > 1:
        cmd += ["-n", str(at_once), "--dist", "worksteal"]
    if baselines:
        cmd += ["--memcheck-baselines", baselines]
    if update:
        cmd.append("--memcheck-update-baselines")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    # an earlier call's report: a part that runs again and writes none must not pass it off as this call's, in the
    # tables or in the merge
    if os.path.exists(report):
        os.remove(report)
    if cold_triton_cache:  # outside OUT: thousands of files
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-cache-{key}-")
    t0 = time.time()
    with open(os.path.join(out, tag, f"{key}.log"), "w") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    SECONDS[key] = time.time() - t0
    print(f"[{tag} {key}] pytest exit {code} in {SECONDS[key]:.1f} s", flush=True)
    _keep_seconds(os.path.join(out, tag), key)
    if not os.path.exists(report):
        return None
    with open(report) as f:
        return json.load(f)


def _keep_seconds(run_dir: str, key: str) -> None:
    """This part's wall beside the earlier calls' in RUN/seconds.json: a run continued in the next call (its parts
    left out for time) gets its tables, and its sum, over all of its parts."""
    path = os.path.join(run_dir, "seconds.json")
    kept = _seconds_of(run_dir)
    kept[key] = round(SECONDS[key], 1)
    with open(path + ".tmp", "w") as f:
        json.dump(kept, f, indent=1)
    os.replace(path + ".tmp", path)  # a call killed at its limit leaves the earlier calls' seconds whole


def _seconds_of(run_dir: str) -> dict[str, float]:
    path = os.path.join(run_dir, "seconds.json")
    try:
        with open(path) as f:
            walls = json.load(f)
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        sys.exit(f"{path}: not JSON ({e.msg}, line {e.lineno}): the run's part seconds; remove it to keep none")
    if not isinstance(walls, dict) or not all(isinstance(v, (int, float)) for v in walls.values()):
        sys.exit(f"{path}: expected {{part: seconds}}, e.g. {{\"r1\": 226.6}}")
    return walls


def earlier_parts(run_dir: str, keys: list[str], reports: dict[str, dict]) -> dict[str, dict]:
    """This call's reports and, for the parts it did not run, those an earlier call of the run left in RUN_DIR (with
    their walls, into SECONDS), in the order of keys."""
    walls, every = _seconds_of(run_dir), {}
    for key in keys:
        path = os.path.join(run_dir, f"{key}.json")
        if key in reports:
            every[key] = reports[key]
        elif key in walls and os.path.exists(path):
            with open(path) as f:
                every[key] = json.load(f)
            SECONDS[key] = walls[key]
    return every


def summary(reports: dict[str, dict]) -> list[tuple]:
    from memcheck import units

    rows = [("item", "verdict", "GPU s", "worker s", "waited s", "timed s", "memory round s", "gpu.heap_alloc.peak",
             "above weights", "kv floor", "tokens/s", "how started")]
    for report in reports.values():
        for item in report["items"]:
            m, ph = item["metrics"], item.get("phases") or {}
            peak, weights = (m.get("gpu.heap_alloc.peak") or {}).get("value"), (item.get("floors") or {}).get("weights")
            started = next((n.split(": ", 1)[1][:40] for n in item.get("notes", []) if n.startswith("worker process")), "")
            gpu_s, rate = item.get("gpu_seconds"), (m.get("tokens_per_s") or {}).get("value")
            rows.append((item["id"], item["verdict"], "-" if gpu_s is None else f"{gpu_s:.1f}", f"{sum(ph.values()):.1f}",
                         f"{ph.get('gpu_wait', 0):.1f}",
                         f"{sum(v for k, v in ph.items() if k not in ('memory_round', 'gpu_wait')):.1f}",
                         f"{ph.get('memory_round', 0):.1f}", units.format_bytes(peak),
                         units.format_bytes(peak - weights) if peak is not None and weights else "-",
                         units.format_bytes((item.get("floors") or {}).get("kv")),
                         "-" if rate is None else f"{rate:.0f}", started))
    return rows


def repeat_rows(first: dict, second: dict) -> tuple[list[tuple], float]:
    """Each memory metric of both runs and their difference; the largest difference of a gpu.* / kv.* metric."""
    from memcheck import units
    from memcheck.metrics.catalog import METRICS

    rows, worst = [("item", "metric", "run 1", "run 2", "diff")], 0.0
    before = {item["id"]: item for item in first["items"]}
    for b in second["items"]:
        a = before.get(b["id"])
        if a is None or b["verdict"] in ("skipped", "error"):
            continue
        for name in MEMORY:
            va, vb = (a["metrics"].get(name) or {}).get("value"), (b["metrics"].get(name) or {}).get("value")
            if va is None or vb is None:
                continue
            diff = (vb - va) / va if va else (0.0 if vb == va else float("inf"))
            if name.startswith(("gpu.", "kv.")):
                worst = max(worst, abs(diff))
            rows.append((b["id"], name, units.format_value(va, METRICS[name].unit),
                         units.format_value(vb, METRICS[name].unit), units.format_percent(diff)))
    return rows, worst


def against_baselines(reports: dict[str, dict]) -> tuple[list[tuple], list[str], dict[str, int]]:
    """Every gpu.*/kv.* number of every measured item beside its committed baseline's (carried in the report):
    the rows, the numbers that moved, and the verdicts counted."""
    from memcheck import units
    from memcheck.metrics.catalog import METRICS

    rows, moved, verdicts = [("item", "verdict", "metric", "baseline", "now", "same")], [], {}
    for report in reports.values():
        for item in report["items"]:
            verdicts[item["verdict"]] = verdicts.get(item["verdict"], 0) + 1
            base = (item.get("baseline") or {}).get("metrics") or {}
            if item["verdict"] == "skipped":
                continue
            for name in sorted(set(base) | set(item["metrics"])):
                if not name.startswith(("gpu.", "kv.")):
                    continue
                was, now = (base.get(name) or {}).get("value"), (item["metrics"].get(name) or {}).get("value")
                same = was == now
                unit = METRICS[name].unit if name in METRICS else ""
                rows.append((item["id"], item["verdict"], name, units.format_value(was, unit) if was is not None
                             else "null", units.format_value(now, unit) if now is not None else "null",
                             "yes" if same else "NO"))
                if not same:
                    moved.append(f"{item['id']} {name}: {was} -> {now}")
    return rows, moved, verdicts


def bound_rows(reports: dict[str, dict]) -> list[tuple]:
    """Items at once: what bounds each part. Its wall beside the seconds the GPU was held at all (the items' GPU
    seconds add up to it), the rest idle (imports before the first claim, a tail of one item); the longest item's own
    seconds (its worker's, less its wait for room), the bound no order beats; the seconds items waited for room."""
    rows = [("part", "wall s", "GPU held s", "GPU idle s", "longest item", "its own s", "waited s, all items")]
    for key, report in reports.items():
        items = [i for i in report["items"] if i.get("gpu_seconds") is not None]
        if not items:
            continue
        own = {i["id"]: sum((i.get("phases") or {}).values()) - (i.get("phases") or {}).get("gpu_wait", 0.0)
               for i in items}
        longest = max(own, key=own.get)
        held = sum(i["gpu_seconds"] for i in items)
        wall = SECONDS.get(key)
        rows.append((key, f"{wall:.1f}" if wall is not None else "-", f"{held:.1f}",
                     f"{wall - held:.1f}" if wall is not None else "-", longest, f"{own[longest]:.1f}",
                     f"{sum((i.get('phases') or {}).get('gpu_wait', 0.0) for i in items):.1f}"))
    return rows


def part_rows(keys: list[str]) -> list[tuple]:
    """Each part's seconds beside BEFORE_S."""
    rows = [("part", "before s", "after s", "after / before")]
    for key in keys:
        before, after = BEFORE_S.get(key), SECONDS.get(key)
        rows.append((key, f"{before:.0f}" if before else "-", f"{after:.1f}" if after is not None else "-",
                     f"{after / before:.2f}" if before and after is not None else "-"))
    if len(keys) > 1:
        before = sum(BEFORE_S.get(k, 0) for k in keys)
        after = sum(SECONDS.get(k, 0.0) for k in keys)
        rows.append(("all", f"{before:.0f}", f"{after:.1f}", f"{after / before:.2f}" if before else "-"))
    return rows


def _items(path: str) -> dict:
    """A report's items, or those of every report in a folder (merged.json left out)."""
    files = ([os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".json") and f != "merged.json"]
             if os.path.isdir(path) else [path])
    items = []
    for name in files:
        with open(name) as f:
            items += json.load(f)["items"]
    if not items:
        raise ValueError(f"{path}: no report items")
    return {"items": items}


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--run", default="run1", help="the run's name: its reports go to OUT/RUN/")
    p.add_argument("--update", action="store_true", help="record the baselines (--memcheck-update-baselines)")
    p.add_argument("--suites", default="vl,v2,r1-long,r1-batch", help=f"of {','.join(PARTS)}, in this order")
    p.add_argument("--budget-s", type=float, default=560.0)
    p.add_argument("--estimates", default="", help="KEY=S,... to replace ESTIMATE_S (a previous call's times)")
    p.add_argument("--profile", default="full", help="the suites' profile (ci: a check of this script on a CPU)")
    p.add_argument("--baselines", default=None, help="the baselines folder (default: the project's)")
    p.add_argument("--compare", nargs=2, metavar="REPORT.json")
    p.add_argument("--at-once", type=int, default=1, help="items measured at once on the GPU (pytest -n)")
    p.add_argument("--cold-triton-cache", action="store_true", help="each part its own empty TRITON_CACHE_DIR, as each CI job")
    p.add_argument("--against-baselines", action="store_true",
                   help="every gpu.*/kv.* number beside the committed baseline's, and the parts beside BEFORE_S")
    args = p.parse_args()
    if args.compare:
        try:
            first, second = (_items(path) for path in args.compare)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--compare: {e}")
        rows, worst = repeat_rows(first, second)
        print(table(rows))
        print(f"largest run-to-run difference of a gpu.*/kv.* metric: {worst * 100:.3f}%")
        return 0
    if not args.out:
        p.error("OUT (the folder for the run's reports) is required, unless --compare")
    try:
        estimates = {**ESTIMATE_S, **{k: float(v) for k, v in (e.split("=") for e in args.estimates.split(",") if e)}}
    except ValueError:
        p.error(f"--estimates {args.estimates!r}: expected PART=SECONDS,... (e.g. vl=160,r1-long=380)")
    unknown = [key for key in args.suites.split(",") if key not in PARTS]
    if unknown:
        p.error(f"--suites: no part named {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    t0, reports, left_out = time.time(), {}, []
    for key in args.suites.split(","):
        left = args.budget_s - (time.time() - t0)
        if estimates[key] > left:
            left_out.append(key)
            print(f"[{args.run} {key}] not started: estimated {estimates[key]:.0f} s, {max(left, 0):.0f} s left",
                  flush=True)
            continue
        report = run_part(args.out, args.run, key, args.update, args.baselines, args.profile, args.at_once,
                          args.cold_triton_cache)
        if report is not None:
            reports[key] = report
    ran = ", ".join(reports) or "no suite"
    reports = earlier_parts(os.path.join(args.out, args.run), args.suites.split(","), reports)
    if reports:  # this call's reports and any an earlier call of the same run left in OUT/RUN
        from memcheck import cli

        cli.main(["merge", "-o", os.path.join(args.out, args.run, "merged.json"),
                  *(os.path.join(args.out, args.run, f"{key}.json") for key in PARTS
                    if os.path.exists(os.path.join(args.out, args.run, f"{key}.json")))])
    earlier, not_run = [k for k in left_out if k in reports], [k for k in left_out if k not in reports]
    print(f"\n{args.run}: {ran} in {time.time() - t0:.1f} s"
          + (f"; from an earlier call: {','.join(earlier)}" if earlier else "")
          + (f"; not run: {','.join(not_run)}" if not_run else ""))
    if reports:
        print(table(summary(reports)))
    if reports and args.at_once > 1:
        print("\n" + table(bound_rows(reports)))
    if args.against_baselines and reports:
        rows, moved, verdicts = against_baselines(reports)
        with open(os.path.join(args.out, args.run, "against-baselines.txt"), "w") as f:
            f.write(table(rows) + "\n")
        per_item: dict[tuple, list[int]] = {}
        for row in rows[1:]:
            counts = per_item.setdefault(row[:2], [0, 0])
            counts[0] += row[5] == "yes"
            counts[1] += 1
        print("\n" + table([("item", "verdict", "gpu.*/kv.* numbers as the baseline's")]
                            + [(*k, f"{same} of {n}") for k, (same, n) in per_item.items()]))
        print("\n" + table(part_rows(list(reports))))
        same = len(rows) - 1 - len(moved)
        print(f"verdicts: {', '.join(f'{n} {v}' for v, n in sorted(verdicts.items()))}; gpu.*/kv.* numbers the same "
              f"as the committed baselines: {same} of {len(rows) - 1}" + (f"; moved: {'; '.join(moved)}" if moved
                                                                          else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
