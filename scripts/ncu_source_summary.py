"""Where one kernel's warps wait, by region of its SASS, from Nsight Compute's source page (stall sampling per
instruction), on any machine: the CSV is small beside the report, and no ncu is needed to read it.

    ncu --clock-control none -k regex:NAME --launch-count 1 --section SourceCounters -o rep python3 ...   # on the GPU
    ncu -i rep.ncu-rep --page source --csv --print-source sass > source.csv
    python scripts/ncu_source_summary.py source.csv [--top 20]

A region is a run of consecutive instructions executed equally often: a loop body (executed per iteration and warp),
what runs once per sequence segment, once per program. Each region's share of the stall samples says where the time
goes; the top instructions say on what (a wait on a tensor-core group, on an async copy, a barrier).
"""
from __future__ import annotations

import argparse
import collections
import csv


def regions(rows: list[dict]) -> list[dict]:
    """Runs of instructions with the same execution count, in address order, with their samples and top opcodes."""
    out = []
    for row in rows:
        executed = float(row["Instructions Executed"] or 0)
        if not out or out[-1]["executed"] != executed:
            out.append({"start": row["Address"], "executed": executed, "instructions": 0, "samples": 0.0,
                        "opcodes": collections.Counter()})
        region = out[-1]
        region["instructions"] += 1
        region["samples"] += float(row["Warp Stall Sampling (All Samples)"] or 0)
        words = row["Source"].split()
        region["opcodes"][words[1] if words and words[0].startswith("@") and len(words) > 1 else
                          (words[0] if words else "?")] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=15, help="instructions with the most samples to list")
    args = ap.parse_args()
    try:
        with open(args.csv, newline="") as f:
            lines = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        ap.error(f"{args.csv}: cannot read it as CSV ({e.__class__.__name__}: {e})")
    header = next((i for i, line in enumerate(lines) if line and line[0] == "Address"), None)
    needed = {"Address", "Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"}
    if header is None or not needed <= set(lines[header]):
        ap.error(f"{args.csv}: no header row with the columns {', '.join(sorted(needed))} "
                 "(ncu -i REPORT --page source --csv --print-source sass writes them)")
    rows = [dict(zip(lines[header], line)) for line in lines[header + 1:] if line]
    total = sum(float(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    print(f"{'from':>8} {'executed':>9} {'instrs':>7} {'samples':>8}  top opcodes")
    for r in regions(rows):
        if r["samples"] / total >= 0.005:
            top = ", ".join(f"{op} {n}" for op, n in r["opcodes"].most_common(5))
            print(f"{r['start'][-6:]:>8} {r['executed']:9.0f} {r['instructions']:7d} {r['samples'] / total:8.1%}  {top}")
    print(f"\ntop {args.top} instructions by stall samples")
    for r in sorted(rows, key=lambda r: -float(r["Warp Stall Sampling (All Samples)"] or 0))[:args.top]:
        share = float(r["Warp Stall Sampling (All Samples)"] or 0) / total
        print(f"{r['Address'][-6:]:>8} {share:6.1%} executed {float(r['Instructions Executed'] or 0):7.0f}  "
              f"{r['Source'].strip()[:80]}")


if __name__ == "__main__":
    main()
