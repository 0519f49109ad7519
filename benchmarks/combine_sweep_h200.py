"""Decode's combine (kernels/work_split.py merge_partials) at other tilings, on the small-batch decode cells where it is
a fifth of the layer: each setting patches the module's constants, rebuilds every cell's CUDA graph, checks the
output against float32 and times the layer (graph replays, L2 flushed, the attention kernel and the combine).

    PYTHONUNBUFFERED=1 python benchmarks/combine_sweep_h200.py [--out DIR]

Writes combine_sweep_h200.json to DIR ($OUT on the device machine) and prints a short table last.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_h200 as grid  # noqa: E402
from kernels_h200 import Cell, bench_graph, rel_err  # noqa: E402
from kernels import work_split  # noqa: E402

CELLS = [Cell(grid.MLA_DECODE, b, k * 1024, 1, heads, 1, 512, 64)
         for heads, b, k in ((128, 32, 1), (128, 8, 4), (128, 1, 32), (128, 256, 1), (16, 8, 4), (16, 1, 64))]
CELLS += [Cell(grid.DECODE, b, k * 1024, 1, 28, 4, 128) for b, k in ((32, 1), (1, 32))]
# (COMBINE_DIM_BLOCK, COMBINE_MAX_TILE): output columns a program, elements a step; the first is the default
SETTINGS = [(work_split.COMBINE_DIM_BLOCK, work_split.COMBINE_MAX_TILE), (128, 4096), (128, 8192), (256, 8192)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    builds = []
    for c in CELLS:
        layers = grid.cell_layers(c, grid.GRID)
        build = (grid.mla_decode_cell if c.family == grid.MLA_DECODE else grid.decode_cell)(c, layers, gen)
        builds.append((c, layers, build, build["reference"]()))
    rows = []
    for dim_block, max_tile in SETTINGS:
        work_split.COMBINE_DIM_BLOCK, work_split.COMBINE_MAX_TILE = dim_block, max_tile
        for c, layers, build, ref in builds:
            err = rel_err(build["output"](), ref)
            us = bench_graph(build["step"], grid.replays_for(0.05)) / layers * 1e3
            rows.append({"cell": c.name, "dim_block": dim_block, "max_tile": max_tile, "us": us, "rel_err": err,
                         "ok": err < grid.BF16_BOUND})
            print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    with open(os.path.join(args.out, "combine_sweep_h200.json"), "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "rows": rows}, f, indent=1)
    names = [c.name for c in CELLS]
    print(f"\n{'cell':24}" + "".join(f"{f'{d}/{t}':>12}" for d, t in SETTINGS) + "   (us a layer; columns a "
          "program / elements a step)")
    for name in names:
        mine = {(r["dim_block"], r["max_tile"]): r for r in rows if r["cell"] == name}
        print(f"{name:24}" + "".join(f"{mine[s]['us']:11.1f}{'' if mine[s]['ok'] else '!'}" + " " for s in SETTINGS))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
