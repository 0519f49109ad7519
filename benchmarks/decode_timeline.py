"""Where a small decode's time goes, program by program: the decode kernels' time stamps (memcheck/kernels/stamps.py) on
kernels_h200.py's grid cells, in a CUDA graph of the cell's layers as the grid times them (one GPU).

Usage: python3 benchmarks/decode_timeline.py [--out DIR] [--config JSON] [CASE ...]

Per case, the layer's time (graph replay, L2 flushed before each) with the stamps off and on (their cost), then, of
the last layer's attention kernel (the last replay): its span, first program started to last done; how far apart the
programs started (the launch); each program's start-up (started -> past griddepcontrol.wait -> its range known); its
work (range known -> done: its tiles, its outputs or partials stored) per tile; and how long the last program ran
past the median one (the tail). What is left of the layer (the layer's time less the span) is the merge of the
partials and the gaps between kernels; the layer timed again with the merge not launched (its outputs wrong) says how
much of it the merge's kernel is, and timed with the merge's kernel launched on its grid but merging nothing (past
its griddepcontrol.wait it ends) how much of that is the boundary between two kernels rather than the merging. A short
table last; JSON and log to --out.
"""
import argparse
import contextlib
import importlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # kernel_bench
from kernel_bench import (DECODE, GRID, H200_COPY_BPS, H200_MM_FLOPS, MLA_DECODE, Cell,  # noqa: E402
                          attention_flops, bench_graph, cell_layers, decode_cell, floor_ms, mla_decode_cell,
                          traffic_bytes)
import kernel_bench  # noqa: E402
from benchmarks import timeline_report  # noqa: E402
from memcheck.kernels import stamps  # noqa: E402
from memcheck.kernels.dispatch import pdl_options  # noqa: E402

MAX_PROGRAMS = 132 * 32  # rows of the stamps buffer: more than any grid of these kernels


def gqa(batch, context):
    return Cell(DECODE, batch, context, 1, 28, 4, 128)


def mla_cell(heads, batch, context):
    return Cell(MLA_DECODE, batch, context, 1, heads, 1, 512, 64)


CASES = {  # the grid's worst small cells and a large one of each kernel for the steady state
    "gqa28-b1x4K": gqa(1, 4096), "gqa28-b1x32K": gqa(1, 32768), "gqa28-b1x128K": gqa(1, 131072),
    "gqa28-b32x1K": gqa(32, 1024), "gqa28-b256x4K": gqa(256, 4096),
    "mla16-b1x32K": mla_cell(16, 1, 32768), "mla16-b1x128K": mla_cell(16, 1, 131072),
    "mla16-b8x32K": mla_cell(16, 8, 32768), "mla64-b2x64K": mla_cell(64, 2, 65536),  # 302 and 151 MB latent caches
    "mla64-b16x16K": mla_cell(64, 16, 16384),  # 302 MB: the seesaw's steady state at 64 heads
    "mla128-b1x128K": mla_cell(128, 1, 131072),  # the MLA grid's worst memory-bound cell (1.81x on an H100)
    "mla16-b8x4K": mla_cell(16, 8, 4096), "mla16-b256x4K": mla_cell(16, 256, 4096),
    "mla128-b1x32K": mla_cell(128, 1, 32768), "mla128-b32x1K": mla_cell(128, 32, 1024),
    "mla128-b8x4K": mla_cell(128, 8, 4096), "mla128-b256x4K": mla_cell(128, 256, 4096),
    # long segments, where the seesaw's loads by halves lose to whole tiles
    "mla16-b32x32K": mla_cell(16, 32, 32768), "mla128-b32x32K": mla_cell(128, 32, 32768),
    # below 128 MB, where a plain read of the layer's bytes takes 2.4-14 us on an H100
    "mla16-b1x1K": mla_cell(16, 1, 1024), "mla64-b1x1K": mla_cell(64, 1, 1024), "mla16-b8x1K": mla_cell(16, 8, 1024),
    "mla16-b1x16K": mla_cell(16, 1, 16384), "mla16-b32x1K": mla_cell(16, 32, 1024),
    "mla16-b8x550": mla_cell(16, 8, 550),  # the batch _mla_decode's min_tiles 2 was chosen on (kernel-decisions.md)
    # the seesaw's small layers at 32 heads (V2/V3 over 4 ranks) and 64, where a partial (32 and 64 KiB in bf16) weighs
    # less than the 72 KiB tile it summarises: whether one-tile ranges pay there too
    "mla32-b1x1K": mla_cell(32, 1, 1024), "mla32-b8x550": mla_cell(32, 8, 550), "mla64-b8x550": mla_cell(64, 8, 550),
    # lines of 64 to 192 tiles, about half the programs to half again more: where one-tile ranges stop paying (their
    # partials' traffic against one chain less a program)
    "mla64-b4x1K": mla_cell(64, 4, 1024), "mla64-b8x750": mla_cell(64, 8, 750), "mla64-b8x1K": mla_cell(64, 8, 1024),
    "mla64-b8x1500": mla_cell(64, 8, 1500),
    "mla32-b8x1K": mla_cell(32, 8, 1024), "mla32-b8x1500": mla_cell(32, 8, 1500),
    # one sequence of 64 tiles, its 64 partials merged over the combine's whole grid: 12 us a layer at 16 heads, 23
    # at 64
    "mla16-b1x4K": mla_cell(16, 1, 4096), "mla32-b1x4K": mla_cell(32, 1, 4096), "mla64-b1x4K": mla_cell(64, 1, 4096),
    # one long sequence, 128-132 partials: the combine's steps and waves, what its registers a thread cost
    "mla32-b1x16K": mla_cell(32, 1, 16384), "mla64-b1x16K": mla_cell(64, 1, 16384),
    "mla32-b1x64K": mla_cell(32, 1, 65536), "mla64-b1x128K": mla_cell(64, 1, 131072),
}
KERNEL_MODULES = ("decode", "mla", "mla_narrow", "mla_seesaw")  # each launches work_split.merge_partials


def tiles_per_program(c, programs):
    """A program's share of its unit's tile line (64-token tiles, as both kernels tile), as line_ranges splits it."""
    units = c.kv_heads if c.family == DECODE else -(-c.q_heads // 64)
    return c.batch * -(-c.context // 64) / max(1, programs // units)


def timeline(stamped, c):
    """The spans above, in us, from the stamps of the programs that ran ([programs, stamps.SLOTS]: times in ns, then
    each program's multiprocessor), and each program's multiprocessor and work."""
    stamped = stamped[(stamped[:, :stamps.TIMES] != 0).all(dim=1)]
    ran, sms = stamped[:, :stamps.TIMES].double() / 1e3, stamped[:, stamps.SLOTS - 1]
    if len(ran) == 0:
        raise ValueError("no program wrote its time stamps")
    started, waited, ranged, done = ran.unbind(1)
    t0 = started.min()
    med = torch.median
    work = done - ranged
    return {"programs": len(ran), "span_us": float(done.max() - t0),
            "launch_p50_us": float(med(started - t0)), "launch_max_us": float((started - t0).max()),
            "wait_p50_us": float(med(waited - started)), "setup_p50_us": float(med(ranged - waited)),
            "work_p50_us": float(med(work)), "work_max_us": float(work.max()),
            "us_per_tile": float(med(work)) / max(1.0, tiles_per_program(c, len(ran))),
            "first_done_us": float(done.min() - t0), "tail_us": float(done.max() - med(done)),
            "timer_step_ns": timer_step_ns(ran), "slowest_sms": slowest(sms, work),
            "work_by_sm_us": {int(sm): round(float(w), 2) for sm, w in zip(sms, work)}, **first_tile(stamped, ranged)}


def first_tile(stamped, ranged):
    """Where the kernel stamps its first tile (stamps.FIRST_IN, FIRST_DONE): medians of range known -> that tile's
    data in, and of its products; {} where it does not."""
    first_in, first_done = stamped[:, stamps.FIRST_IN], stamped[:, stamps.FIRST_DONE]
    took = (first_in != 0) & (first_done != 0)
    if not took.any():
        return {}
    first_in, first_done = first_in[took].double() / 1e3, first_done[took].double() / 1e3
    return {"first_in_p50_us": float(torch.median(first_in - ranged[took])),
            "first_tile_p50_us": float(torch.median(first_done - first_in))}


def slowest(sms, work, count=8):
    """The multiprocessors of the programs that worked longest, slowest first, as sm:us."""
    order = work.argsort(descending=True)[:count]
    return " ".join(f"{int(sms[i])}:{float(work[i]):.0f}" for i in order)


def timer_step_ns(ran):
    """The smallest step between two distinct stamps: the timer's resolution, at most."""
    steps = ran.flatten().sort().values.diff()
    return float(steps[steps > 0].min() * 1e3) if (steps > 0).any() else None


@contextlib.contextmanager
def merge_skipped():
    """The decode kernels' merge of partials not launched (their outputs wrong): what the layer costs without it."""
    with contextlib.ExitStack() as stack:
        for name in KERNEL_MODULES:
            module = importlib.import_module(f"memcheck.kernels.{name}")
            stack.enter_context(mock.patch.object(module, "merge_partials", lambda *args, **kwargs: None))
        yield


@triton.jit
def _boundary_only(PDL: tl.constexpr):
    """The merge's place in the layer with nothing merged: launched as it is (early, where PDL), waits, ends."""
    if PDL:
        gdc_wait()


class _BoundaryLaunch:
    """Stands in for work_split.combine_cut_units: the same grid and launch options, _boundary_only's work."""

    def __getitem__(self, grid):
        def launch(*args, PDL, num_warps, **constexprs):
            _boundary_only[grid](num_warps=num_warps, **pdl_options(PDL))
        return launch


@contextlib.contextmanager
def merge_emptied():
    """The merge's kernel launched on its grid but merging nothing (the outputs wrong): the kernel boundary's cost."""
    with mock.patch.object(importlib.import_module("memcheck.kernels.work_split"), "combine_cut_units",
                           _BoundaryLaunch()):
        yield


def run_case(name, c, gen, config=None):
    """config: the kernel's config beside its defaults (e.g. {"narrow": true}), stamped and not."""
    layers = cell_layers(c, GRID)
    build = (mla_decode_cell if c.family == MLA_DECODE else decode_cell)(c, layers, gen)
    buf = torch.zeros(MAX_PROGRAMS, stamps.SLOTS, dtype=torch.int64, device="cuda")
    on = build["with_config"]({**(config or {}), "stamps": buf})
    row = {"case": name, "cell": c.name, "layers": layers, "config": config or {},
           "floor_us": floor_ms(traffic_bytes(c), attention_flops(c), H200_COPY_BPS, H200_MM_FLOPS) * 1e3}
    row["layer_off_us"] = bench_graph(build["with_config"](config) if config else build["step"]) / layers * 1e3
    with merge_skipped():
        row["no_merge_us"] = bench_graph(build["with_config"](config or {})) / layers * 1e3
    with merge_emptied():
        row["empty_merge_us"] = bench_graph(build["with_config"](config or {})) / layers * 1e3
    buf.zero_()
    row["layer_on_us"] = bench_graph(on) / layers * 1e3
    row.update(timeline(buf.cpu(), c))
    row["rest_us"] = row["layer_on_us"] - row["span_us"]
    return row


COLUMNS = [  # key, heading, width, format
    ("case", "case", 15, "<"), ("floor_us", "floor", 6, ".1f"), ("layer_off_us", "layer", 7, ".1f"),
    ("layer_on_us", "stamped", 7, ".1f"),
    ("no_merge_us", "-merge", 6, ".1f"), ("empty_merge_us", "empty", 6, ".1f"), ("span_us", "kernel", 7, ".1f"),
    ("launch_max_us", "launch", 6, ".1f"),
    ("wait_p50_us", "wait", 5, ".1f"), ("setup_p50_us", "setup", 5, ".1f"),
    ("first_in_p50_us", "in", 4, ".1f"), ("first_tile_p50_us", "tile1", 5, ".1f"), ("first_done_us", "1st", 6, ".1f"),
    ("work_p50_us", "work", 7, ".1f"), ("us_per_tile", "/tile", 5, ".2f"), ("tail_us", "tail", 5, ".1f"),
    ("rest_us", "rest", 6, ".1f"), ("programs", "progs", 5, ""), ("slowest_sms", "slowest (sm:work us)", 20, ""),
]


LEGEND = ("us per layer; floor: the layer's bytes at the H200's copy rate or its FLOPs at the H200's matmul rate "
          "(kernel_bench's, on any card: on an H100 it reads low); kernel: first program started -> last done; "
          "launch: the last program's start after the first; wait, setup, work: medians (past "
          "griddepcontrol.wait; range known; its tiles and stores); in, tile1: medians of the first tile's data "
          "arriving after the range is known, and of its products (where the kernel stamps them); 1st: the first "
          "program done; tail: the last done after the median; rest: the layer less the kernel (the merge, the "
          "gaps); -merge: the layer with the merge not launched; empty: with the merge's kernel launched on its grid, "
          "merging nothing")


def table(rows):
    return timeline_report.table(rows, COLUMNS, LEGEND)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", metavar="CASE", help=f"default: every one of {', '.join(CASES)}")
    ap.add_argument("--out", default=os.environ.get("OUT", ".out"), help="folder for JSON and log")
    ap.add_argument("--config", type=json.loads, default=None,
                    help='the kernels\' config beside their defaults, as JSON (e.g. \'{"narrow": true}\')')
    ap.add_argument("--flush", choices=("write", "read", "none"), default=kernel_bench.FLUSH,
                    help="how L2 is emptied before each replay (none: warm, what a cold start costs)")
    args = ap.parse_args()
    kernel_bench.FLUSH = args.flush
    unknown = [n for n in args.cases if n not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]!r}: the cases are {', '.join(CASES)}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU: the stamps are the GPU's global timer")
    gen = torch.Generator().manual_seed(0)
    rows = timeline_report.collect([({"case": name}, lambda name=name: run_case(name, CASES[name], gen, args.config))
                                    for name in args.cases or CASES])
    timeline_report.write(args.out, "decode_timeline", rows, table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
