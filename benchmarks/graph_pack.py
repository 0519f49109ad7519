"""Host time of packing one CUDA-graph decode step's inputs (DecodeGraphs.pack), on the CPU: the part of a graph
step's host side that is ours (the copy, replay and token read-back are CUDA's). Prints microseconds per step.

    .venv/bin/python benchmarks/graph_pack.py [--max-batch 32] [--blocks 40]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from memcheck.stacks.paged.graphs import DecodeGraphs  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--blocks", type=int, default=40, help="blocks in each sequence's table")
    args = p.parse_args()
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # the host buffer only: no CUDA needed
    graphs.max_batch, graphs.width = args.max_batch, args.blocks + 8
    graphs.host = torch.zeros(args.max_batch * (4 + graphs.width), dtype=torch.int32)
    for b in sorted({1, 8, args.max_batch}):
        tables = [list(range(i * args.blocks, (i + 1) * args.blocks)) for i in range(b)]
        step = (list(range(b)), [600 + i for i in range(b)], [9000 + i for i in range(b)], tables)
        for _ in range(200):
            graphs.pack(*step)
        start = time.perf_counter()
        for _ in range(2000):
            graphs.pack(*step)
        print(f"batch {b}: {(time.perf_counter() - start) / 2000 * 1e6:.1f} us per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
