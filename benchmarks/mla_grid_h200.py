"""MLA decode over the range DeepSeek serving runs, on an H200, each cell judged by what bounds its layer: 16 to 128
heads, batches of 1 to 256, 1K to 128K tokens, cache blocks of 16 and 64 tokens, with the layer's latent cache size.

    PYTHONUNBUFFERED=1 python benchmarks/mla_grid_h200.py [--heads 16,32] [--blocks 16,64] [--rounds 3] [--out DIR]
        [--budget-s 450]
    python benchmarks/mla_grid_h200.py --dry-run    # the cells and their bands at the H200's nominal rates, no GPU
    python benchmarks/mla_grid_h200.py --join A.json B.json    # one grid of the result files of several calls, no GPU
    python benchmarks/mla_grid_h200.py --join benchmarks/mla_grid/nvidia-h100.json    # a committed grid (a file a card)

The grid takes more than one device call: each call starts cells while --budget-s lasts, names those it did not
start, and writes OUT/mla_grid_h200.json as it goes; --join prints the tables of several calls' files as one grid.

The bands and their goals:
  compute-bound (its FLOPs at the matmul rate measured in the call take longer than its bytes at the copy rate):
      <= 1.25x of that matmul floor;
  memory-bound, a latent cache of 128 MB or more: <= 1.10x of the copy floor;
  memory-bound, below 128 MB: <= 1.15x of the fastest plain read of the same bytes, timed the same way
      (benchmarks/at_size_h200.py's rule: small layers are as slow to read as to attend).
A layer is timed as benchmarks/mla_bandwidth_h200.py times it (a CUDA graph of layers past 640 MB, L2 emptied before
each replay, the median of the rounds). Caches past MAX_CACHE_BYTES are left out and named (two layers and the read's
buffers would not fit); caches up to CHECK_BYTES are checked against the float32 reference, larger ones timed only
(the reference holds a float32 copy of the cache). A cell that fails is a row with its error; the others go on.
Printed last: a row per cell, then each band's worst cell and how many cells meet its goal.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402
import mla_bandwidth_h200 as mb  # noqa: E402

HEADS = (16, 32, 64, 128)
BATCHES = (1, 8, 32, 128, 256)
CONTEXTS = (1024, 4096, 16384, 65536, 131072)
BLOCK_SIZES = (16, 64)
MAX_CACHE_BYTES = 20e9
CHECK_BYTES = 1.5e9
LARGE_BYTES = 128e6  # the memory-bound bands' boundary
GOALS = {"compute-bound": 1.25, ">= 128 MB": 1.10, "< 128 MB": 1.15}
ROW_FIELDS = ("cell", "cache_mb", "copy_floor_us", "compute_floor_us")  # and a band of GOALS
AGAINST = {"compute-bound": "matmul floor", ">= 128 MB": "copy floor", "< 128 MB": "fastest read"}


def grid_cells(heads=HEADS, blocks=BLOCK_SIZES):
    """(cells to time, cells left out for their size), in order of heads, block size, context, batch."""
    cells, left_out = [], []
    for h in heads:
        for block in blocks:
            for n in CONTEXTS:
                for b in BATCHES:
                    c = kb.Cell(kb.MLA_DECODE, b, n, 1, h, 1, 512, 64, block_size=block)
                    (cells if kb.cache_bytes(c) <= MAX_CACHE_BYTES else left_out).append(c)
    return cells, left_out


def band(c, copy_bps, matmul_flops):
    """The cell's band and its floors (us): the bytes at the copy rate, the FLOPs at the matmul rate."""
    memory_us = kb.traffic_bytes(c) / copy_bps * 1e6
    compute_us = kb.attention_flops(c) / matmul_flops * 1e6
    if compute_us > memory_us:
        return "compute-bound", memory_us, compute_us
    return (">= 128 MB" if kb.cache_bytes(c) >= LARGE_BYTES else "< 128 MB"), memory_us, compute_us


def judge(row):
    """The cell's time against its band's reference, and whether that meets the band's goal."""
    us = row.get("ours_us")
    if us is None:
        return row
    reference = {"compute-bound": row["compute_floor_us"], ">= 128 MB": row["copy_floor_us"],
                 "< 128 MB": row.get("read_us")}[row["band"]]
    row["ratio"] = us / reference
    row["met"] = row["ratio"] <= GOALS[row["band"]]
    return row


def worst_rows(rows):
    """Per band: cells timed, cells meeting the goal, the worst cell and its ratio."""
    out = [("band", "goal", "cells", "met", "worst cell", "x")]
    for name, goal in GOALS.items():
        timed = [r for r in rows if r["band"] == name and "ratio" in r]
        worst = max(timed, key=lambda r: r["ratio"], default=None)
        out.append((name, f"<= {goal:.2f}x the {AGAINST[name]}", str(len(timed)), str(sum(r["met"] for r in timed)),
                    worst["cell"] if worst else "-", f"{worst['ratio']:.2f}" if worst else "-"))
    return out


def table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def cell_rows(rows):
    out = [("cell", "cache MB", "band", "copy floor us", "matmul floor us", "read us", "ours us", "x", "goal", "met")]
    for r in rows:
        us = r.get("ours_us")
        out.append((r["cell"], f"{r['cache_mb']:.0f}", r["band"], f"{r['copy_floor_us']:.1f}",
                    f"{r['compute_floor_us']:.1f}", f"{r['read_us']:.1f}" if r.get("read_us") else "-",
                    f"{us:.1f}" if us else r.get("error", "-")[:60], f"{r['ratio']:.2f}" if "ratio" in r else "-",
                    f"{GOALS[r['band']]:.2f}", ("yes" if r["met"] else "NO") if "met" in r else "-"))
    return out


def time_cell(c, gen, flush, rounds):
    """Our default MLA decode (the paged stack's call) and the plain reads of one cell: {name: us a layer}, whether
    its output was within bounds of the float32 reference, and whether it was checked."""
    row, graphs, keep = mb.build(c, ["default"], gen, check=kb.cache_bytes(c) <= CHECK_BYTES)
    for name, graph in graphs.items():  # each graph once, alone: a fault names its graph
        graph.replay()
    for _ in range(rounds):
        for name, graph in graphs.items():
            row.setdefault(f"{name}_rounds", []).append(mb.replay_ms(graph, flush) / row["layers"] * 1e3)
    times = {name: statistics.median(row[f"{name}_rounds"]) for name in graphs}
    del graphs, keep
    return times, row["ok"], "default_rel_err" in row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", ".out"))
    p.add_argument("--heads", default=",".join(map(str, HEADS)), help="of 16,32,64,128")
    p.add_argument("--blocks", default=",".join(map(str, BLOCK_SIZES)), help="cache block sizes, of 16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=450, help="start no cell after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their bands at nominal rates")
    p.add_argument("--join", nargs="+", metavar="RESULT.json", help="print the grid of these calls' result files")
    args = p.parse_args()
    if args.join:
        return join(args.join)
    try:
        heads = [int(h) for h in args.heads.split(",")]
        blocks = [int(b) for b in args.blocks.split(",")]
    except ValueError:
        p.error("--heads and --blocks: comma-separated integers, as 16,32")
    cells, left_out = grid_cells(heads, blocks)
    if args.dry_run:
        rows = [("cell", "cache MB", "band at nominal rates")]
        rows += [(c.name, f"{kb.cache_bytes(c) / 1e6:.0f}", band(c, kb.H200_COPY_BPS, kb.H200_MM_FLOPS)[0])
                 for c in cells]
        print(table(rows))
        print(f"{len(cells)} cells; left out for their size: {', '.join(c.name for c in left_out) or 'none'}")
        return 0
    import torch

    kb.require_gpu("mla_grid_h200.py", has_dry_run=True)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    kb.FLUSH = "read"
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    copy_bps, matmul_flops = kb.copy_bandwidth(), kb.matmul_rate()
    print(f"copy {copy_bps / 1e12:.3f} TB/s, matmul {matmul_flops / 1e12:.0f} TFLOP/s", flush=True)
    flush = kb.flush_l2()
    rows, not_started = [], []
    for c in cells:
        if time.time() - t0 > args.budget_s:
            not_started.append(c.name)
            continue
        name, copy_us, compute_us = band(c, copy_bps, matmul_flops)
        row = {"cell": c.name, "cache_mb": kb.cache_bytes(c) / 1e6, "band": name, "copy_floor_us": copy_us,
               "compute_floor_us": compute_us}
        try:
            times, ok, checked = time_cell(c, gen, flush, args.rounds)
            row.update(ours_us=times["default"], read_us=min(times[f"read {config}"] for config in mb.READS),
                       checked=checked, ok=ok)
            if not ok:
                row["error"] = "differs from the float32 reference"
                row.pop("ours_us")
        except Exception as e:  # noqa: BLE001 - one cell's failure is its row; the grid goes on
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        torch.cuda.empty_cache()
        rows.append(judge(row))
        print("cell", json.dumps(row), flush=True)
        with open(os.path.join(args.out, "mla_grid_h200.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_bps": copy_bps, "matmul_flops": matmul_flops,
                       "rounds": args.rounds, "cells": rows, "left_out": [c.name for c in left_out]}, f, indent=1)
    print(f"\n{table(cell_rows(rows))}")
    if not_started:
        print(f"\nnot started, past --budget-s {args.budget_s:.0f}: {len(not_started)} cells, "
              f"{', '.join(not_started)}")
    checked = [r for r in rows if r.get("checked")]
    print(f"\n{torch.cuda.get_device_name()}: copy {copy_bps / 1e12:.3f} TB/s, matmul {matmul_flops / 1e12:.0f} "
          f"TFLOP/s; {len(rows)} cells "
          f"({sum(r.get('ok', False) for r in checked)} of {len(checked)} checked against float32 within "
          f"{kb.BF16_BOUND}), {sum('error' in r for r in rows)} failed; left out for their size: "
          f"{', '.join(c.name for c in left_out) or 'none'}; {time.time() - t0:.0f} s")
    print(table(worst_rows(rows)))
    return 0 if not any("error" in r for r in rows) and not not_started else 1


def join(paths):
    """The cell table and the worst cell per band of several calls' result files, as one grid (a cell timed in
    more than one keeps its last call's row). A file that is not this script's result is a one-line error."""
    cells, devices = {}, set()
    for path in paths:
        try:
            with open(path) as f:
                result = json.load(f)
            rows = result["cells"]
            devices.add(result["device"])
            for r in rows:  # what the tables read of a row
                missing = [k for k in ROW_FIELDS if not isinstance(r.get(k), (int, float) if k != "cell" else str)]
                if missing or r.get("band") not in GOALS:
                    raise ValueError(f"cell {r.get('cell')!r}: no {', '.join(missing) or 'known band'}")
            cells.update({r["cell"]: r for r in rows})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"mla_grid_h200.py: {path}: not a result of this script ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    rows = list(cells.values())
    print(table(cell_rows(rows)))
    print(f"\n{len(rows)} cells from {len(paths)} files on {', '.join(sorted(devices))}; "
          f"{sum('error' in r for r in rows)} failed")
    print(table(worst_rows(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
