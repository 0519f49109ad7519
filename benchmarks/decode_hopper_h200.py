"""The Hopper dense decode (Gluon: kernels/decode_hopper.py) on an H200, in one device call: its answers against the
float32 reference and Triton's _decode on shapes that exercise the split (odd lengths, empty sequences, one long
sequence merged from many partials, any grid, 16- and 64-token cache blocks, GQA, MQA, MHA, head_dim 64, a group of
64 heads), then its time beside Triton's (kernels/decode.py's DEFAULT_CONFIG) on dense cells of issue 14's grid,
timed as kernels_h200.py times them (CUDA-graph replays, L2 flushed, layers' caches past L2). Triton's interpreter
cannot run Gluon: this is the kernel's correctness test on the GPU (the CPU suite only compiles it for sm_90).

    PYTHONUNBUFFERED=1 python benchmarks/decode_hopper_h200.py [--out DIR] [--cells 28/4:b1x32K ...]

Writes decode_hopper_h200.json to DIR ($OUT on the device machine) and prints a short table last.
"""
import argparse
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_h200 as grid  # noqa: E402
from check_run import check_then_time  # noqa: E402
from kernels_h200 import Cell, bench_graph, bf16, rel_err  # noqa: E402
from kernels import decode, reference  # noqa: E402

BOUND = grid.BF16_BOUND  # relative error of a bf16 output against the float32 reference
TRITON = {**decode.DEFAULT_CONFIG, "hopper": False}
# the Gluon kernel's variants (the default first): a ring of 4 tiles, one program a multiprocessor; a ring of 2, two
VARIANTS = {"hopper": decode.HOPPER_CONFIG, "hopper-2x2": {**decode.HOPPER_CONFIG, "num_stages": 2,
                                                         "programs_per_sm": 2}}
# query heads, KV heads, head_dim, sequence lengths, cache block size, grid (None: the kernel's own)
CHECKS = [
    (28, 4, 128, [1, 17, 64, 65, 1000, 4097], 16, None),
    (28, 4, 128, [0, 300, 0, 5, 2048, 63], 64, None),
    (28, 4, 128, [131072], 16, None),  # one long sequence: 33 partials a KV head
    (28, 4, 128, [129, 3000, 1, 777], 16, 4),  # one range a KV head: everything in one program
    (28, 4, 128, [129, 3000, 1, 777], 16, 7),  # not a multiple of the KV heads
    (32, 8, 128, [5000] * 3 + [40], 16, 264),
    (32, 32, 128, [33] * 40, 64, None),  # MHA, many whole sequences a range
    (8, 1, 64, [1, 100, 257, 4000], 16, None),  # MQA, head_dim 64
    (64, 1, 128, [1000, 70], 16, None),  # a group of 64 heads: the whole wgmma block
    (7, 1, 128, [300] * 200, 16, None),  # 200 sequences
]
CELLS = ["28/4:b1x4K", "28/4:b1x32K", "28/4:b1x128K", "28/4:b8x4K", "28/4:b8x32K", "28/4:b32x1K", "28/4:b32x4K",
         "28/4:b128x1K", "28/4:b256x4K", "28/4:b256x32K", "32/8:b1x32K", "32/8:b1x128K", "32/8:b8x4K", "32/32:b1x4K",
         "32/32:b8x4K", "32/32:b32x1K", "32/32:b256x1K"]


def check(q_heads, kv_heads, head_dim, lengths, block_size, programs, gen):
    table, num_blocks = grid.scattered_tables(lengths, gen, block_size)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q, scale = bf16(len(lengths), q_heads, head_dim), head_dim ** -0.5
    k, v = bf16(num_blocks, block_size, kv_heads, head_dim), bf16(num_blocks, block_size, kv_heads, head_dim)

    def run(cfg):
        out = torch.full_like(q, float("nan"))
        return decode.paged_decode(q, k, v, table, seq_lens, scale, out=out, config=cfg, num_programs=programs)

    ref = reference.paged_decode(q.float(), k.float(), v.float(), table, seq_lens, scale)
    row = {"heads": f"{q_heads}/{kv_heads}", "head_dim": head_dim, "block_size": block_size, "programs": programs,
           "lengths": lengths if len(lengths) < 10 else f"{len(lengths)} x {lengths[0]}",
           "triton_rel_err": rel_err(run(TRITON), ref)}
    for name, cfg in VARIANTS.items():
        out = run(cfg)
        row[f"{name}_rel_err"] = rel_err(out, ref) if not out.isnan().any() else math.inf
    row["ok"] = all(row[f"{name}_rel_err"] < BOUND for name in VARIANTS)
    return row


def cell(name):
    """<q heads>/<kv heads>:b<batch>x<context>K, as 28/4:b1x32K: a dense decode cell (argparse's type: a bad name is a
    usage error)."""
    found = re.fullmatch(r"(\d+)/(\d+):b(\d+)x(\d+)K", name)
    if not found:
        raise argparse.ArgumentTypeError(f"{name!r} is not a cell: <q heads>/<kv heads>:b<batch>x<context>K")
    return Cell(grid.DECODE, int(found[3]), int(found[4]) * 1024, 1, int(found[1]), int(found[2]), 128, 0)


def time_cell(c, bandwidth, rate, gen):
    layers = grid.cell_layers(c, grid.GRID)
    floor = grid.floor_ms(grid.traffic_bytes(c), grid.attention_flops(c), bandwidth, rate)
    build = grid.decode_cell(c, layers, gen)
    triton_out = build["output_with"](TRITON)
    row = {"cell": c.name, "floor_us": floor * 1e3}
    for name, cfg in {**VARIANTS, "triton": TRITON}.items():
        us = bench_graph(build["with_config"](cfg), grid.replays_for(floor * layers)) / layers * 1e3
        row.update({f"{name}_us": us, f"{name}_x": us / (floor * 1e3)})
        if name != "triton":
            row[f"{name}_rel_err_vs_triton"] = rel_err(build["output_with"](cfg), triton_out)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    parser.add_argument("--cells", nargs="*", type=cell, default=[cell(name) for name in CELLS],
                        help="cells to time, as 28/4:b1x32K")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    checks = [(f"{spec}", lambda spec=spec: check(*spec, gen)) for spec in CHECKS]
    result = check_then_time(os.path.join(args.out, "decode_hopper_h200.json"), checks, args.cells, time_cell, gen)
    if result is None:
        return 1
    names = [*VARIANTS, "triton"]
    print(f"{'dense cell':22} {'floor us':>9}" + "".join(f"{n + ' us':>13} {'x':>6}" for n in names)
          + f" {'triton / ' + names[0]:>16}")
    for r in result["cells"]:
        times = "".join(f"{r[n + '_us']:13.1f} {r[n + '_x']:6.2f}" for n in names)
        print(f"{r['cell']:22} {r['floor_us']:9.1f}{times} {r['triton_us'] / r[names[0] + '_us']:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
