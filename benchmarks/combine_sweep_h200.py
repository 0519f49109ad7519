"""Decode's combine (memcheck/kernels/work_split.py merge_partials) in other settings, on the small-batch decode cells where it
is a fifth of the layer: each setting patches the module's constants, rebuilds every cell's CUDA graph, checks the
output against float32 and times the layer (graph replays, L2 flushed, the attention kernel and the combine).
Settings run in the order given and then again reversed, so that a drift of the machine shows as a difference between
a setting's two times.

    PYTHONUNBUFFERED=1 python benchmarks/combine_sweep_h200.py [--out DIR]

Writes combine_sweep_h200.json to DIR ($OUT on the device machine) and prints a short table last.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402
from kernel_bench import Cell, bench_graph, rel_err  # noqa: E402
from memcheck.kernels import work_split  # noqa: E402

CELLS = [Cell(kb.MLA_DECODE, b, k * 1024, 1, heads, 1, 512, 64)
         for heads, b, k in ((128, 32, 1), (128, 8, 4), (128, 1, 32), (128, 1, 128), (128, 256, 1), (16, 8, 4),
                             (16, 1, 64))]
CELLS += [Cell(kb.DECODE, b, k * 1024, 1, 28, 4, 128) for b, k in ((32, 1), (1, 32))]
# (name, the module's constants it sets); the first is the default (what earlier sweeps tried and dropped:
# docs/kernel-decisions.md)
SETTINGS = [("default", {}), ("32 unrolled", {"COMBINE_UNROLL_J": 32}),
            ("2 an SM, 32 unrolled", {"COMBINE_PROGRAMS_PER_SM": 2, "COMBINE_UNROLL_J": 32})]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    args = parser.parse_args()
    kb.require_gpu("combine_sweep_h200.py")
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    builds = []
    for c in CELLS:
        layers = kb.cell_layers(c, kb.GRID)
        build = (kb.mla_decode_cell if c.family == kb.MLA_DECODE else kb.decode_cell)(c, layers, gen)
        builds.append((c, layers, build, build["reference"]()))
    rows = []
    defaults = {name: getattr(work_split, name) for _, changes in SETTINGS for name in changes}
    for setting, changes in SETTINGS + SETTINGS[::-1]:
        for name, value in {**defaults, **changes}.items():
            setattr(work_split, name, value)
        for c, layers, build, ref in builds:
            err = rel_err(build["output"](), ref)
            us = bench_graph(build["step"], kb.replays_for(0.05)) / layers * 1e3
            rows.append({"cell": c.name, "setting": setting, "us": us, "rel_err": err, "ok": err < kb.BF16_BOUND})
            print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name(0)
    with open(os.path.join(args.out, "combine_sweep_h200.json"), "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "rows": rows}, f, indent=1)
    names = [c.name for c in CELLS]
    print(f"\n{'cell':24}" + "".join(f"{name:>18}" for name, _ in SETTINGS) + "   (us a layer: first run, second)")
    for cell in names:
        line = f"{cell:24}"
        for name, _ in SETTINGS:
            mine = [r for r in rows if r["cell"] == cell and r["setting"] == name]
            times = " / ".join(f"{r['us']:.1f}" for r in mine)
            line += f"{times:>17}{'' if all(r['ok'] for r in mine) else '!'} "
        print(line)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
