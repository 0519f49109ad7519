"""Where a short prefill's time goes, item by item: the Hopper prefill's time stamps (memcheck/kernels/prefill_hopper.py,
STAMP_NAMES) on prefill_hopper_h200.py's cells, timed as kernels_h200.py times them (CUDA-graph replays, L2 flushed).

Usage: python3 benchmarks/prefill_timeline.py [--out DIR] [--variants NAME ...] [CELL ...]   (cells: 1x2K, mla16h4K)

Per cell and variant (prefill_hopper_h200.VARIANTS): the call's time with the stamps off and on (their cost), then,
of the last replay, per item of a program (a query tile of one head): how long its first consumer waited for the
query after turning to it, its first key tile (the scores' wait: that tile's keys and its products), each later
tile (last product less first scores, over the tiles after the first), and the output's store; the kernel's span
(first item turned to last stored); and for the program with the most tiles, its tiles at that rate against its
items' fixed time. A short table last; JSON and log to --out.
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernel_bench as kb  # noqa: E402
from prefill_hopper_h200 import VARIANTS, cell  # noqa: E402
import timeline_report  # noqa: E402
from memcheck.kernels import prefill_hopper  # noqa: E402

CELLS = ["1x2K", "8x2K", "1x8K", "mla16h4K"]
ROWS = 132 * 64  # stamp rows: programs x rounds of every cell here (one program an item: 8 x 2K's 3,584 items)


def items(stamped):
    """The items that ran: their stamp rows, and [n, 6] float64 of times in us from the first item's turn and tiles."""
    rows = (stamped[:, 4] != 0).nonzero().flatten()
    ran = stamped[rows].double()
    times = (ran[:, :5] - (ran[:, 0].min() if len(ran) else 0)) / 1e3
    return rows, torch.cat([times, ran[:, 5:]], dim=1)


def timeline(rows, ran, rounds):
    """The medians and sums above, in us (a program's items are rows program x rounds ..)."""
    if len(ran) == 0:
        raise ValueError("no item wrote its time stamps (the kernel ran another path, or the buffer is too small)")
    turned, query, first, last, stored, tiles = ran.unbind(1)
    later = tiles > 1
    per_tile = float(((last - first)[later] / (tiles[later] - 1)).median())
    fixed = (stored - turned) - (tiles - 1) * per_tile
    programs = rows // rounds
    busiest = torch.zeros(int(programs.max()) + 1, dtype=torch.float64).index_add_(0, programs, tiles).argmax()
    mine = programs == busiest
    med = lambda x: float(x.median())  # noqa: E731
    return {"items": len(ran), "programs": int(programs.unique().numel()),
            "span_us": float(stored.max() - turned.min()),
            "query_wait_us": med(query - turned), "first_tile_us": med(first - query), "per_tile_us": per_tile,
            "store_us": med(stored - last), "item_fixed_us": med(fixed),
            "busiest_tiles": float(tiles[mine].sum()), "busiest_items": int(mine.sum()),
            "busiest_tiles_us": float((tiles[mine] - 1).sum() * per_tile), "busiest_fixed_us": float(fixed[mine].sum()),
            "busiest_done_us": float(stored[mine].max()), "tail_us": float(stored.max() - stored.median())}


def run_cell(name, variant, gen):
    c = cell(name)
    build = kb.BUILDERS[c.family](c, 1, gen)
    floor = kb.floor_ms(kb.traffic_bytes(c), kb.attention_flops(c), kb.H200_COPY_BPS, kb.H200_MM_FLOPS)
    buf = torch.zeros(ROWS, len(prefill_hopper.STAMP_NAMES), dtype=torch.int64, device="cuda")
    cfg = VARIANTS[variant]
    replays = kb.replays_for(floor)
    row = {"cell": name, "variant": variant, "floor_us": floor * 1e3,
           "off_us": kb.bench_graph(build["with_config"](cfg), replays) * 1e3}
    buf.zero_()
    row["on_us"] = kb.bench_graph(build["with_config"]({**cfg, "stamps": buf}), replays) * 1e3
    tiles = -(-c.new // prefill_hopper.BLOCK_M)  # query tiles a sequence
    _, rounds = prefill_hopper.rounds_of(tiles * c.q_heads * c.batch, tiles, torch.device("cuda"))
    row.update(timeline(*items(buf.cpu()), rounds))
    return row


COLUMNS = [  # key, heading, width, format
    ("cell", "cell", 9, "<"), ("variant", "variant", 17, "<"), ("floor_us", "floor", 6, ".1f"),
    ("off_us", "call", 7, ".1f"), ("on_us", "stamped", 7, ".1f"), ("span_us", "kernel", 7, ".1f"),
    ("items", "items", 5, ""), ("query_wait_us", "query", 5, ".2f"), ("first_tile_us", "tile1", 5, ".2f"),
    ("per_tile_us", "/tile", 5, ".2f"), ("store_us", "store", 5, ".2f"), ("item_fixed_us", "fixed", 5, ".2f"),
    ("busiest_items", "b.itm", 5, ""), ("busiest_tiles_us", "b.tile", 6, ".1f"),
    ("busiest_fixed_us", "b.fix", 6, ".1f"),
    ("busiest_done_us", "b.done", 6, ".1f"), ("tail_us", "tail", 5, ".1f"),
]


LEGEND = ("us; call: graph replay, stamps off; kernel: first item turned to last stored; query, tile1, /tile, "
          "store: medians per item (the query's wait, the first key tile, each later tile, the output); fixed: an "
          "item's time less its later tiles at /tile; b.*: the program with the most tiles: its items, its later "
          "tiles at /tile, its items' fixed time, its last item stored; tail: the last item stored after the median")


def table(rows):
    return timeline_report.table(rows, COLUMNS, LEGEND)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="*", metavar="CELL", help=f"default: {' '.join(CELLS)}")
    ap.add_argument("--variants", nargs="*", default=["hopper"], choices=list(VARIANTS))
    ap.add_argument("--out", default=os.environ.get("OUT", ".out"), help="folder for JSON and log")
    args = ap.parse_args()
    for name in args.cells:
        try:
            cell(name)
        except argparse.ArgumentTypeError as e:
            ap.error(str(e))
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU: the stamps are the GPU's global timer")
    gen = torch.Generator().manual_seed(0)
    rows = timeline_report.collect([({"cell": name, "variant": variant},
                                     lambda name=name, variant=variant: run_cell(name, variant, gen))
                                    for name in args.cells or CELLS for variant in args.variants])
    timeline_report.write(args.out, "prefill_timeline", rows, table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
