"""MLA decode on memory-bound layers (16 to 64 heads, latent caches of 128 MB to 1.2 GB) beside dense decode of the
same bytes, a plain read of those bytes and the copy floor, on an H200, in one device call: every variant checked
against the float32 reference, then the variants timed alternately in rounds (medians of the rounds), a short table
last.

    PYTHONUNBUFFERED=1 python benchmarks/mla_bandwidth_h200.py [--variants seesaw ...] [--rounds 3] [--out DIR]

A layer is timed as a decode step runs it: one call per layer's cache in a CUDA graph, as many layers as pass 640 MB
(each layer's cache read from HBM), L2 emptied of the timed data before each replay by reading 256 MB
(kernel_bench.FLUSH "read": clean lines, as a step's weight reads leave it). The time given is per layer. Floor: the
layer's bytes (cache, queries, output) at the copy bandwidth measured in the same call (a 4 GiB device-to-device
copy, bytes read and written). "read": the cache's bytes read once, contiguous, by the fastest of two streaming reads
(benchmarks/at_size_h200.py's), timed the same way. Dense cells are GQA 28/4 at head_dim 128 (2 KiB a token) with as
many cache bytes as the MLA cell beside them.

Variants (MLA): "seesaw" the default (memcheck/kernels/mla.py
on sm_90: memcheck/kernels/mla_seesaw.py),
"triton" memcheck/kernels/mla.py's _mla_decode (16 and 32 heads only: its 16- and 32-head blocks run no padded rows),
"seesaw-unmerged" the default with its partials left unmerged (a diagnostic, timed only: the default less it is what
the merge of the partials and its gap cost a layer), "default" the kernels' entry point with no config, as the paged
stack calls it (benchmarks/mla_grid_h200.py times it), "narrow" memcheck/kernels/mla_narrow.py (32 heads or fewer).
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402
import mla_hopper_h200 as mh  # noqa: E402
from at_size_h200 import read_call  # noqa: E402
from memcheck.kernels import mla  # noqa: E402

STEP_BYTES = 640e6  # a timed graph holds layers of at least this many bytes together
SEESAW = mh.SEESAW
VARIANTS = {
    "seesaw": SEESAW,
    "triton": None,  # mla.decode_config(heads) with hopper off
    "seesaw-unmerged": SEESAW,  # captured without its merge (unmerged): timed, never checked
    "default": None,  # memcheck.kernels.mla_decode as the paged stack calls it: no config, its dispatch's choice
    "narrow": mh.NARROW,
    "narrow-trigger": {**mh.NARROW, "trigger": True},  # its merge launched (PDL) once each program's last tile is asked
}
UNCHECKED = {"seesaw-unmerged"}
# (heads, batch, context): 16 heads (V2-Lite; V2/V3 over 8 ranks), 32 (over 4), 64 (over 2)
CELLS = [
    (16, 1, 131072), (16, 2, 81920), (16, 8, 32768), (16, 32, 32768),
    (32, 16, 8192), (32, 4, 49152),
    (64, 2, 65536), (64, 8, 16384), (64, 44, 6144), (64, 32, 32768),
]
DENSE = [(28, 4, 4, 18432), (28, 4, 8, 18432), (28, 4, 32, 18432)]  # 151 MB, 302 MB, 1.2 GB
CHECKS = [spec for spec in mh.CHECKS if spec[0] <= 64] + [(64, [1024] * 29 + [3000, 100, 0], 16, None)]
READS = ((8192, 8, 8), (16384, 8, 8))


def mla_cell(heads, batch, context):
    return kb.Cell(kb.MLA_DECODE, batch, context, 1, heads, 1, 512, 64)


def dense_cell(q_heads, kv_heads, batch, context):
    return kb.Cell(kb.DECODE, batch, context, 1, q_heads, kv_heads, 128)


def config_of(name, heads):
    if name == "triton":
        return {**mla.decode_config(heads), "hopper": False}
    return mh.config_at(VARIANTS[name], heads)


@contextlib.contextmanager
def unmerged(name):
    """For "seesaw-unmerged", the seesaw's merge of the partials left out of what is captured meanwhile."""
    from memcheck.kernels import mla_seesaw

    merge = mla_seesaw.merge_partials
    if name in UNCHECKED:
        mla_seesaw.merge_partials = lambda *args, **kwargs: None
    try:
        yield
    finally:
        mla_seesaw.merge_partials = merge


def applies(name, heads):
    return name not in ("triton", "narrow", "narrow-trigger") or heads <= 32


def layers_of(c):
    return max(2, math.ceil(STEP_BYTES / kb.cache_bytes(c)))


def replay_ms(graph, flush, replays=23, warm=3):
    """Median of the replays after `warm`, L2 flushed before each, ms."""
    return statistics.median(kb.replay_times(graph, flush, replays)[warm:])


def build(c, names, gen, check=True):
    """(row, {name: graph}) for one cell: its checks against the float32 reference (layer 0; check False: none, the
    reference's float32 copy of a large cache left out) and its graphs."""
    layers = layers_of(c)
    row = {"cell": c.name, "family": c.family, "cache_mb": kb.cache_bytes(c) / 1e6, "layers": layers,
           "traffic_bytes": kb.traffic_bytes(c)}
    graphs = {}
    if c.family == kb.MLA_DECODE:
        fns = kb.mla_decode_cell(c, layers, gen)
        ref = fns["reference"]() if check else None
        for name in names:
            if not applies(name, c.q_heads):
                continue
            cfg = config_of(name, c.q_heads)
            if check and name not in UNCHECKED:
                out = fns["output"]() if name == "default" else fns["output_with"](cfg)
                row[f"{name}_rel_err"] = kb.rel_err(out, ref) if not out.isnan().any() else math.inf
            with unmerged(name):
                graphs[name] = kb.graph_of(fns["step"] if name == "default" else fns["with_config"](cfg))
        del ref
    else:
        fns = kb.decode_cell(c, layers, gen)
        row["dense_rel_err"] = kb.rel_err(fns["output"](), fns["reference"]())
        graphs["dense"] = kb.graph_of(fns["step"])
    buffers = [torch.empty(kb.cache_bytes(c) // 2, device="cuda", dtype=torch.bfloat16).normal_()
               for _ in range(layers)]
    for config in READS:
        graphs[f"read {config}"] = kb.graph_of(read_call(buffers, config))
    row["ok"] = all(v < kb.BF16_BOUND for k, v in row.items() if k.endswith("_rel_err"))
    return row, graphs, (fns, buffers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3, help="every variant timed this many times, alternately")
    parser.add_argument("--cells", nargs="*", type=mh.cell, help="MLA cells instead of CELLS, as 16h:b8x32K")
    parser.add_argument("--no-dense", action="store_true", help="leave the dense cells out")
    parser.add_argument("--no-checks", action="store_true", help="leave the small-shape checks out")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    kb.require_gpu("mla_bandwidth_h200.py")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    kb.FLUSH = "read"
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "variants": args.variants, "checks": [], "cells": []}
    path = os.path.join(args.out, "mla_bandwidth_h200.json")

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    checked = [n for n in args.variants if n != "triton" and n not in UNCHECKED]
    mh.VARIANTS.update({n: VARIANTS[n] for n in checked})  # mh.check runs its variants by name
    for spec in ([] if args.no_checks else CHECKS):
        row = mh.check(*spec, gen, checked)
        print("check", json.dumps(row), flush=True)
        result["checks"].append(row)
    bandwidth = kb.copy_bandwidth()
    result["copy_bandwidth"] = bandwidth
    print(f"copy {bandwidth / 1e12:.3f} TB/s", flush=True)
    cells = [mla_cell(*spec) for spec in CELLS] if args.cells is None else args.cells
    cells += [] if args.no_dense else [dense_cell(*spec) for spec in DENSE]
    flush = kb.flush_l2()
    for c in cells:
        row, graphs, keep = build(c, args.variants, gen)
        row["floor_us"] = row["traffic_bytes"] / bandwidth * 1e6
        for name, graph in graphs.items():  # each graph once, alone: a fault names its graph
            print("probe", c.name, name, flush=True)
            graph.replay()
            torch.cuda.synchronize()
        for _ in range(args.rounds):  # the variants alternately, round by round
            for name, graph in graphs.items():
                row.setdefault(f"{name}_rounds", []).append(replay_ms(graph, flush) / row["layers"] * 1e3)
        for name in graphs:
            row[f"{name}_us"] = statistics.median(row[f"{name}_rounds"])
        row["read_us"] = min(row[f"read {config}_us"] for config in READS)
        print("cell", json.dumps(row), flush=True)
        result["cells"].append(row)
        save()
        del graphs, keep
        torch.cuda.empty_cache()
    result["seconds"] = time.time() - t0
    save()
    checks_ok = sum(r["ok"] for r in result["checks"])
    print(f"\nchecks: {checks_ok} of {len(result['checks'])} ok; timed cells checked: "
          f"{sum(r['ok'] for r in result['cells'])} of {len(result['cells'])}; copy {bandwidth / 1e12:.3f} TB/s; "
          f"medians of {args.rounds} rounds, us a layer (x the copy floor)")
    names = [n for n in args.variants] + ["dense"]
    names = [n for n in names if any(f"{n}_us" in row for row in result["cells"])]
    print(f"{'cell':24} {'MB':>6} {'floor':>7} {'read':>12}" + "".join(f" {n:>20}" for n in names))
    for row in result["cells"]:
        line = f"{row['cell']:24} {row['cache_mb']:6.0f} {row['floor_us']:7.1f} " \
               f"{row['read_us']:6.1f} {row['read_us'] / row['floor_us']:5.2f}"
        for n in names:
            us = row.get(f"{n}_us")
            line += f" {us:13.1f} {us / row['floor_us']:5.2f}x" if us else f" {'-':>20}"
        print(line)
    print(f"total {time.time() - t0:.0f} s")
    return 0 if checks_ok == len(result["checks"]) and all(r["ok"] for r in result["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
