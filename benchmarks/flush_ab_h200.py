"""Our decode layers timed under both of kernels_h200.py's L2 flushes, alternately on one start (write, read, write,
read, ...), so clock drift through a run cannot pass for the flush's effect.

    PYTHONUNBUFFERED=1 python benchmarks/flush_ab_h200.py [--rounds 4] [--out DIR]

Prints, per cell, the median of each flush's rounds (us per layer, each round itself a median of graph replays) and
their ratio; writes flush_ab_h200.json to DIR.
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kernel_bench
import kernel_bench as kb  # noqa: E402

CELLS = ("GQA 28/4 b32 x 1K", "GQA 28/4 b1 x 32K", "GQA 32/8 b8 x 4K", "MLA 128h b8 x 4K", "MLA 128h b1 x 32K",
         "MLA 128h b32 x 1K", "MLA 16h b1 x 64K", "MLA 16h b32 x 4K", "MLA 128h b256 x 4K")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    kb.require_gpu("flush_ab_h200.py")
    os.makedirs(args.out, exist_ok=True)
    cells = {c.name: c for c in kb.all_cells(kb.GRID) if c.new == 1}
    gen, rows = torch.Generator().manual_seed(0), []
    for name in CELLS:
        c = cells[name]
        layers = kb.cell_layers(c, kb.GRID)
        step = kb.BUILDERS[c.family](c, layers, gen)["step"]
        times = {"write": [], "read": []}
        for _ in range(args.rounds):
            for flush in times:
                kb.FLUSH = flush
                times[flush].append(kb.bench_graph(step) / layers * 1e3)
        row = {"name": name, "layers": layers, **{f"{k}_us": v for k, v in times.items()}}
        row["read_over_write"] = statistics.median(times["read"]) / statistics.median(times["write"])
        rows.append(row)
        print(f"{name:24s} write {statistics.median(times['write']):8.1f} us  read {statistics.median(times['read']):8.1f}"
              f" us  read/write {row['read_over_write']:.3f}  (rounds: write {[round(t, 1) for t in times['write']]},"
              f" read {[round(t, 1) for t in times['read']]})", flush=True)
        del step
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "flush_ab_h200.json"), "w") as f:
        json.dump({"rounds": args.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
