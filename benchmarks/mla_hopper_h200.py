"""The Hopper MLA decode (Gluon: memcheck/kernels/mla_seesaw.py, the default on sm_90) on an H200, in one device call:
its answers against the float32 reference and Triton's kernel on shapes that exercise the split (odd lengths, empty
sequences, one long sequence merged from many partials, any grid, 16- and 64-token cache blocks, the stack's transposed
query layout, fewer heads than a 64-head block), then its time beside Triton's (memcheck/kernels/mla.py at its default
config for the head count, hopper off) on 128- and 16-head cells of the kernels' grid (16 heads: one block, 48 rows
masked), timed as kernels_h200.py times them (CUDA-graph replays, L2 flushed, layers' caches past L2). Triton's
interpreter cannot run Gluon: tests/gpu runs these checks as tests (pytest -m gpu).

    PYTHONUNBUFFERED=1 python benchmarks/mla_hopper_h200.py [--out DIR] [--cells b8x4K ...] [--variants seesaw ...]

Writes mla_hopper_h200.json to DIR ($OUT on the device machine) and prints a short table last.
"""
import argparse
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402
from check_run import check_then_time  # noqa: E402
from kernel_bench import Cell, bench_graph, bf16, rel_err  # noqa: E402
from memcheck.kernels import mla, reference  # noqa: E402

BOUND = kb.BF16_BOUND  # relative error of a bf16 output against the float32 reference


def seesaw_config(heads):
    """memcheck/kernels/mla_seesaw.py as the stack runs it at this many heads (its ranges: min_tiles), where it runs."""
    return {**mla.decode_config(heads, hopper=True), "narrow": False}


SEESAW = seesaw_config
NARROW = mla.FEW_HEADS_HOPPER_CONFIG  # memcheck/kernels/mla_narrow.py as the stack runs it: the heads as N


def triton_config(heads):
    """Triton's kernel at the default config for this many heads (64-head blocks above 32 heads, 16 at 16)."""
    return {**mla.decode_config(heads), "hopper": False}


# the seesaw checked and timed beside Triton's; seesaw-again: the default once more, listed last, so that a drift of
# the machine within the run shows (what was tried and dropped: docs/kernel-decisions.md)
VARIANTS = {"seesaw": SEESAW, "seesaw-again": SEESAW}
# heads, sequence lengths, cache block size, grid (None: the kernel's own)
CHECKS = [
    (128, [1, 17, 64, 65, 1000, 4097], 16, None),
    (64, [0, 300, 0, 5, 2048, 63], 64, None),
    (128, [70000], 16, None),  # one long sequence: ~130 partials a head block
    (128, [129, 3000, 1, 777], 16, 2),  # one range a head block: everything in one program
    (128, [129, 3000, 1, 777], 16, 7),  # not a multiple of the head blocks
    (256, [5000] * 3 + [40], 16, 264),  # 4 head blocks, more programs than tiles
    (128, [33] * 40, 64, None),  # many whole sequences a range
    # fewer heads than a block (V2-Lite's 16; 40 a block and a part): the rows past the last head masked
    (16, [1, 17, 64, 65, 1000, 4097], 16, None),
    (16, [70000], 16, None),
    (16, [1000] * 8, 64, None),  # 128 tiles, fewer than the programs: one-tile ranges at mla_narrow's min_tiles 1
    (40, [0, 300, 0, 5, 2048, 63], 64, None),
    (32, [1, 17, 64, 65, 1000, 4097], 16, None),  # V2/V3 over 4 tensor-parallel ranks
    # sequences cut into 2 ranges a head block (128 heads), into 4 (16), and a mix of 1, 2 and more
    (128, [1024] * 32, 16, None),
    (16, [1024] * 32, 16, None),
    (128, [1024] * 29 + [3000, 100, 0], 16, None),
    # one short sequence in one-tile ranges: its 16 partials merged by the combine's few-partials step, in a grid
    # sized for a sequence of 132
    (64, [1000], 64, None),
    (16, [1000], 16, None),
    # 63 and 47 partials: merged as one tile by the combine's programs of a block each
    (64, [4000], 64, None),
    (16, [3000], 16, None),
    # one long sequence at 64 heads: 132 partials, merged in three steps of the combine's [64, 2, 32] tile
    (64, [70000], 64, None),
]
CELLS = ["b1x1K", "b1x32K", "b1x128K", "b8x1K", "b8x4K", "b32x1K", "b32x4K", "b8x32K", "b128x4K", "b256x4K",
         "b256x32K", "16h:b1x32K", "16h:b1x64K", "16h:b1x128K", "16h:b8x4K", "16h:b8x32K", "16h:b32x4K", "16h:b32x32K",
         "16h:b256x4K", "16h:b256x32K"]


def config_at(cfg, heads):
    """A variant's config at this many heads: fixed, or a function of the heads (the stack's, as SEESAW)."""
    return cfg(heads) if callable(cfg) else cfg


def poison_unused(cache, table, lengths):
    """NaN in every cache slot no sequence holds (a block's slots past its sequence's end, blocks of no sequence):
    a kernel must mask the values it reads there, not only their scores (0 x NaN reaches the output)."""
    block_size = cache.shape[1]
    used = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    slots = torch.arange(block_size, device=cache.device)
    for i, n in enumerate(lengths):
        for j in range(-(-n // block_size)):
            used[table[i, j].long()] |= slots < n - j * block_size
    cache[~used] = float("nan")


def check(heads, lengths, block_size, programs, gen, variants):
    table, num_blocks = kb.scattered_tables(lengths, gen, block_size)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q_lat = bf16(heads, len(lengths), 512).transpose(0, 1)  # the stack's layout
    q_pe, cache, scale = bf16(len(lengths), heads, 64), bf16(num_blocks, block_size, 576), (128 + 64) ** -0.5
    poison_unused(cache, table, lengths)

    def run(cfg):
        out = torch.full_like(q_lat, float("nan"))
        return mla.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, out=out, config=cfg, num_programs=programs)

    ref = reference.mla_decode(q_lat.float(), q_pe.float(), cache.float(), table, seq_lens, scale)
    row = {"heads": heads, "lengths": (lengths if len(lengths) < 10 else f"{len(lengths)} x {lengths[0]}"
                                           if len(set(lengths)) == 1 else f"{lengths[:2]} ... {lengths[-3:]}"),
           "block_size": block_size, "programs": programs, "triton_rel_err": rel_err(run(triton_config(heads)), ref)}
    for name in variants:
        out = run(config_at(VARIANTS[name], heads))
        row[f"{name}_rel_err"] = rel_err(out, ref) if not out.isnan().any() else math.inf
    row["ok"] = all(row[f"{name}_rel_err"] < BOUND for name in variants)
    return row


def cell(name):
    """[<heads>h:]b<batch>x<context>K[/<block size>], as b8x4K (128 heads), 16h:b1x64K or 16h:b1x64K/64: an MLA decode
    cell (argparse's type: a bad name is a usage error)."""
    found = re.fullmatch(r"(?:(\d+)h:)?b(\d+)x(\d+)K(?:/(\d+))?", name)
    if not found:
        raise argparse.ArgumentTypeError(f"{name!r} is not a cell: [<heads>h:]b<batch>x<context>K[/<block size>], "
                                         "as 16h:b8x4K or 16h:b8x4K/64")
    return Cell(kb.MLA_DECODE, int(found[2]), int(found[3]) * 1024, 1, int(found[1] or 128), 1, 512, 64,
                block_size=int(found[4] or kb.BLOCK))


def time_cell(c, bandwidth, rate, gen, timed):
    layers = kb.cell_layers(c, kb.GRID)
    floor = kb.floor_ms(kb.traffic_bytes(c), kb.attention_flops(c), bandwidth, rate)
    build = kb.mla_decode_cell(c, layers, gen)
    triton_out = build["output_with"](triton_config(c.q_heads))
    row = {"cell": c.name, "floor_us": floor * 1e3}
    for name in timed:
        cfg = triton_config(c.q_heads) if name == "triton" else config_at(VARIANTS[name], c.q_heads)
        us = bench_graph(build["with_config"](cfg), kb.replays_for(floor * layers)) / layers * 1e3
        row.update({f"{name}_us": us, f"{name}_x": us / (floor * 1e3)})
        if name != "triton":
            row[f"{name}_rel_err_vs_triton"] = rel_err(build["output_with"](cfg), triton_out)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    parser.add_argument("--cells", nargs="*", type=cell, default=[cell(name) for name in CELLS],
                        help="cells to time, as b8x4K (128 heads) or 16h:b1x64K")
    parser.add_argument("--variants", nargs="*", choices=[*VARIANTS, "triton"], default=[*VARIANTS, "triton"],
                        help="kernels to check and time, the first the one the others are compared with "
                             "(triton: memcheck/kernels/mla.py's own; the others' answers are compared with it either way)")
    parser.add_argument("--tables", nargs="+", choices=["scattered", "contiguous"], default=[kb.TABLES],
                        help="the timed cells' cache blocks: at random places, or each sequence's in order (each "
                             "cell timed with each)")
    args = parser.parse_args()
    kb.require_gpu("mla_hopper_h200.py")
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    names = args.variants
    gluon = [n for n in names if n != "triton"]
    checks = [(f"{spec}", lambda spec=spec: check(*spec, gen, gluon)) for spec in CHECKS]

    def timed(cell_tables, bandwidth, rate, gen):
        c, kb.TABLES = cell_tables  # the checks' tables scattered either way
        return {**time_cell(c, bandwidth, rate, gen, names), "tables": kb.TABLES}

    result = check_then_time(os.path.join(args.out, "mla_hopper_h200.json"), checks,
                             [(c, t) for t in args.tables for c in args.cells], timed, gen)
    if result is None:
        return 1
    others = names[1:]
    print(f"{'MLA cell':22} {'floor us':>9}" + "".join(f"{n + ' us':>12} {'x':>6}" for n in names)
          + "".join(f" {n + ' / ' + names[0]:>16}" for n in others))
    for r in result["cells"]:
        times = "".join(f"{r[n + '_us']:12.1f} {r[n + '_x']:6.2f}" for n in names)
        ratios = "".join(f" {r[n + '_us'] / r[names[0] + '_us']:16.2f}" for n in others)
        label = r["cell"] + ("" if r["tables"] == "scattered" else " contig")
        print(f"{label:22} {r['floor_us']:9.1f}{times}{ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
