"""Where paged decode's time goes, by Nsight Compute's hardware counters: each case's attention kernel launched once
after its compile, for ncu to profile (one GPU).

Usage (on the device machine; ncu's clock control off, as the device notes ask):
  ncu --clock-control none -k regex:'_mla_decode|_decode' --launch-skip 0 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      python3 benchmarks/decode_ncu.py [CASE ...]
Without ncu it times each case (CUDA events, L2 not flushed) and prints a line per case, so a run shows what ran.

Cases are kernels_h200.py grid cells (the same cache layout, block tables scattered at random), with a config name:
the default, or a variant from CONFIGS.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # kernel_bench
from kernel_bench import DECODE, MLA_DECODE, Cell, decode_cell, mla_decode_cell  # noqa: E402
from memcheck.kernels import mla  # noqa: E402

CONFIGS = {  # MLA decode variants beside the default: 32-head blocks at 128 heads (mma.sync; the loop spills)
    "mla-32-head-blocks": mla.MID_HEADS_CONFIG,
}
CASES = {  # name: (cell, config name or None)
    "mla16-b256x4K": (Cell(MLA_DECODE, 256, 4096, 1, 16, 1, 512, 64), None),
    "mla128-b256x4K": (Cell(MLA_DECODE, 256, 4096, 1, 128, 1, 512, 64), None),
    "mla128-b256x4K-32-head-blocks": (Cell(MLA_DECODE, 256, 4096, 1, 128, 1, 512, 64), "mla-32-head-blocks"),
    "gqa28-b32x1K": (Cell(DECODE, 32, 1024, 1, 28, 4, 128), None),
    # 128 heads at small batches: well over the per-tile time of b256 x 4K
    "mla128-b1x4K": (Cell(MLA_DECODE, 1, 4096, 1, 128, 1, 512, 64), None),
    "mla128-b8x1K": (Cell(MLA_DECODE, 8, 1024, 1, 128, 1, 512, 64), None),
    "mla128-b32x1K": (Cell(MLA_DECODE, 32, 1024, 1, 128, 1, 512, 64), None),
    # one sequence: 1.6-3x of the floor where batches of the same kernels reach 0.95-1.15x
    "gqa28-b1x32K": (Cell(DECODE, 1, 32768, 1, 28, 4, 128), None),
    "mla16-b1x64K": (Cell(MLA_DECODE, 1, 65536, 1, 16, 1, 512, 64), None),
    "mla128-b1x32K": (Cell(MLA_DECODE, 1, 32768, 1, 128, 1, 512, 64), None),
    # long segments (248 tiles a program), where the seesaw's loads by halves lose to whole tiles
    "mla16-b32x32K": (Cell(MLA_DECODE, 32, 32768, 1, 16, 1, 512, 64), None),
    # memory-bound layers of ~300 MB (benchmarks/mla_bandwidth_h200.py): MLA at 16 and 64 heads beside dense decode of
    # the same cache bytes (GQA 28/4, 2 KiB a token)
    "mla16-b8x32K": (Cell(MLA_DECODE, 8, 32768, 1, 16, 1, 512, 64), None),
    "mla64-b44x6K": (Cell(MLA_DECODE, 44, 6144, 1, 64, 1, 512, 64), None),
    "gqa28-b8x18K": (Cell(DECODE, 8, 18432, 1, 28, 4, 128), None),
    # small layers, one sequence in one-tile ranges: the merge of 16 and of 64 partials (combine_cut_units)
    "mla64-b1x1K": (Cell(MLA_DECODE, 1, 1024, 1, 64, 1, 512, 64), None),
    "mla64-b1x4K": (Cell(MLA_DECODE, 1, 4096, 1, 64, 1, 512, 64), None),
    # one long sequence: 128 and 132 partials, merged in two and three steps (-k regex:combine_cut_units)
    "mla64-b1x16K": (Cell(MLA_DECODE, 1, 16384, 1, 64, 1, 512, 64), None),
    "mla64-b1x128K": (Cell(MLA_DECODE, 1, 131072, 1, 64, 1, 512, 64), None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", metavar="CASE", help=f"default: every one of {', '.join(CASES)}")
    args = ap.parse_args()
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]!r}: the cases are {', '.join(CASES)}")
    gen = torch.Generator().manual_seed(0)
    for name in args.cases or CASES:
        cell, config = CASES[name]
        build = mla_decode_cell if cell.family == MLA_DECODE else decode_cell
        fns = build(cell, 1, gen)
        run = fns["with_config"](CONFIGS[config]) if config else fns["step"]
        run()  # compile and warm up: ncu profiles this launch too, the second is the one to read
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        print(f"{name}: {start.elapsed_time(end) * 1e3:.1f} us (one call, L2 warm)", flush=True)
        del fns, run
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
