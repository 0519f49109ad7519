"""What the H200's own fastest paths do at the size of each of the kernels' grid cells, beside our kernels: how far
the floor (bytes once at the copy bandwidth, FLOPs at the 8192^3 matmul rate) is from what the hardware delivers on a
problem that small.

    PYTHONUNBUFFERED=1 python benchmarks/at_size_h200.py --grid-json DIR/kernels_h200.json [--min-floor-us 10] [--out DIR]
    TRITON_INTERPRET=1 python benchmarks/at_size_h200.py --dry-run   # CPU smoke test of this script

For each grid cell that ran, with a floor of --min-floor-us or more (the cells the grid's worst case counts):
- decode (dense and MLA): "read", the cell's cache bytes read once by the fastest of a few streaming reads (a
  Triton grid-stride sum at several sizes, torch.sum), contiguous, no block table: a decode that did nothing else;
- MLA decode: "cuBLAS", the two products of the cell (scores = q x latent^T, out = scores x latent[:, :512]) by
  torch.bmm, unfused and without the softmax, per sequence;
- prefill (dense, and MLA's decompressed 192/128 widths): "cuDNN", torch SDPA's cuDNN backend on a contiguous cache
  (FlashAttention-3-class kernels on Hopper), where it takes the shape; the refusal is recorded where it does not.
Each is timed as kernels_h200.py times ours: CUDA-graph replays with L2 flushed before each, a small decode cache as
that many bytes of layers' caches, one call each. Also once: one and two empty kernels a layer (a layer's kernel
boundaries in a graph). Floors and our times come from the grid JSON (run it first, on the same start). Writes
at_size_h200.json and at_size_h200.log to --out and prints a table last: every column x the cell's floor.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kernel_bench
import kernel_bench as kb  # noqa: E402
from memcheck.kernels.dispatch import sm_count  # noqa: E402

LOG = []
GOAL_X = {kb.MLA_DECODE: 1.10, kb.DECODE: 1.10, kb.PREFILL: 1.4, kb.MLA_PREFILL: 1.4, kb.MLA_MHA_PREFILL: 1.4}
# Streaming reads: (elements a program a step, warps, programs a multiprocessor; None: one program a block)
READS = ((4096, 4, 16), (8192, 8, 8), (16384, 8, 8), (8192, 8, None))
REFERENCES = ("read_ms", "cublas_ms", "cudnn_ms")  # a row's times of the references, where they ran


def log(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)


@triton.jit
def _read_once(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Sums this program's blocks (grid-stride) in float32: every byte of x read once, one float written."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, tl.num_programs(0).to(tl.int64) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _nothing(x_ptr):
    """An empty kernel: what a launch costs in a graph."""
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)


def sms():
    return sm_count(torch.device(kb.DEVICE))


def read_call(buffers, config):
    """One call per layer's buffer: the Triton read at `config`, or torch.sum where config is "torch.sum"."""
    if config == "torch.sum":
        return lambda: [torch.sum(x, dtype=torch.float32) for x in buffers]
    block, warps, per_sm = config
    n = buffers[0].numel()
    programs = triton.cdiv(n, block) if per_sm is None else min(per_sm * sms(), triton.cdiv(n, block))
    out = torch.empty(programs, device=kb.DEVICE, dtype=torch.float32)
    return lambda: [_read_once[(programs,)](x, out, n, BLOCK=block, num_warps=warps) for x in buffers]


def time_read(c, layers, replays):
    """The fastest read of the cell's cache bytes, per layer (ms), and which read it was."""
    buffers = [torch.empty(kb.cache_bytes(c) // kb.DTYPE.itemsize, device=kb.DEVICE, dtype=kb.DTYPE).normal_()
               for _ in range(layers)]
    timed = []
    for config in (*READS, "torch.sum"):
        call = read_call(buffers, config)
        timed.append((kb.bench_graph(call, replays) / layers, str(config)))
    ms, config = min(timed)
    return {"read_ms": ms, "read_config": config}


def time_products(c, layers, replays):
    """MLA decode's two products by cuBLAS, per layer (ms): scores [b, h, context] then out [b, h, rank]."""
    width = c.head_dim + c.rope
    latents = [kb.bf16(c.batch, c.context, width) for _ in range(layers)]
    q = kb.bf16(c.batch, c.q_heads, width)
    scores = torch.empty(c.batch, c.q_heads, c.context, device=kb.DEVICE, dtype=kb.DTYPE)
    out = torch.empty(c.batch, c.q_heads, c.head_dim, device=kb.DEVICE, dtype=kb.DTYPE)

    def step():
        for lat in latents:
            torch.bmm(q, lat.mT, out=scores)
            torch.bmm(scores, lat[..., :c.head_dim], out=out)

    return {"cublas_ms": kb.bench_graph(step, replays) / layers}


def time_cudnn(c, replays):
    """torch SDPA's cuDNN backend on the cell's problem (MLA: the decompressed widths; GQA: keys and values repeated
    at the query heads' count, as its cuDNN path needs), per call (ms)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qk, v = c.floor_dims or (c.head_dim, c.head_dim)
    q = kb.bf16(c.batch, c.q_heads, c.new, qk)
    k, val = kb.bf16(c.batch, c.q_heads, c.context, qk), kb.bf16(c.batch, c.q_heads, c.context, v)

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return kb.causal_sdpa(q, k, val, qk ** -0.5)

    call()
    return {"cudnn_ms": kb.bench_graph(call, replays)}


def boundaries_us(layers=64):
    """One and two empty kernels a layer, each on every multiprocessor, per layer (us)."""
    x = torch.zeros(1, device=kb.DEVICE)
    grid = (sms(),)
    one = kb.bench_graph(lambda: [_nothing[grid](x) for _ in range(layers)]) / layers
    two = kb.bench_graph(lambda: [_nothing[grid](x) for _ in range(2 * layers)]) / layers
    return {"one_kernel_us": one * 1e3, "two_kernels_us": two * 1e3}


def measure(c, layers, floor_ms):
    """The references for one cell: {name_ms: ms} and {name_error: why} where one could not run."""
    row, replays = {}, kb.replays_for(floor_ms * layers)
    jobs = []
    if c.new == 1:
        jobs.append(("read", lambda: time_read(c, layers, replays)))
    if c.family == kb.MLA_DECODE:
        jobs.append(("cublas", lambda: time_products(c, layers, replays)))
    if c.family in kb.PREFILLS:
        jobs.append(("cudnn", lambda: time_cudnn(c, replays)))
    for name, job in jobs:
        try:
            row.update(job())
        except Exception as e:  # noqa: BLE001 - e.g. cuDNN refusing the shape: recorded, the next reference runs
            row[name + "_error"] = str(e).splitlines()[0][:200] if str(e) else repr(e)
        if kb.DEVICE == "cuda":
            torch.cuda.empty_cache()
    return row


def grid_rows(path, min_floor_us, g):
    """(cell, the grid's row) for the grid JSON's measured cells with a floor of min_floor_us or more; without a
    JSON (dry run) every cell of g with a nominal H200 floor and no time of ours."""
    cells = {(c.family, c.name): c for c in kb.all_cells(g)}
    if path is None:
        return [(c, {"floor_ms": kb.floor_ms(kb.traffic_bytes(c), kb.attention_flops(c), kb.H200_COPY_BPS,
                                             kb.H200_MM_FLOPS), "ms": None}) for c in cells.values()]
    try:
        with open(path) as f:
            rows = json.load(f)["rows"]
        return [(cells[r["family"], r["name"]], r) for r in rows if r["status"] == "ok"
                and r["floor_ms"] * 1e3 >= min_floor_us and (r["family"], r["name"]) in cells]
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = f"no field {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise SystemExit(f"at_size_h200.py: --grid-json {path}: not a kernels_h200.py --grid JSON ({why})") from None


def x_of(row, key):
    return f"{row[key] / row['floor_ms']:.2f}" if row.get(key) else "-"


def report(rows, bounds):
    """Per cell, x its floor: ours, the read, cuBLAS's products, cuDNN's attention; then per family the cells whose
    fastest reference is itself past the goal."""
    log("")
    log(f"a layer's kernel boundaries in a CUDA graph: one empty kernel {bounds['one_kernel_us']:.1f} us, "
        f"two {bounds['two_kernels_us']:.1f} us")
    log("x floor (floor from the grid JSON); read: the cache bytes read once; cuBLAS: MLA's two products unfused; "
        "cuDNN: SDPA's cuDNN backend; goal: the family's x floor (GOAL_X)")
    log(f"{'family':26s} {'case':34s} {'floor us':>9s} {'ours':>6s} {'read':>6s} {'cuBLAS':>6s} {'cuDNN':>6s} "
        f"{'goal':>5s}")
    for r in rows:
        log(f"{r['family']:26s} {r['name']:34s} {r['floor_ms'] * 1e3:9.1f} {x_of(r, 'ms'):>6s} "
            f"{x_of(r, 'read_ms'):>6s} {x_of(r, 'cublas_ms'):>6s} {x_of(r, 'cudnn_ms'):>6s} {GOAL_X[r['family']]:5.2f}")
    log("")
    log("per family: cells at or under the goal (ours), and cells where the fastest reference is over the goal itself")
    for family in kb.FAMILIES:
        mine = [r for r in rows if r["family"] == family]
        if not mine:
            continue
        goal = GOAL_X[family]
        met = [r for r in mine if r.get("ms") and r["ms"] / r["floor_ms"] <= goal]
        refs = [(min(r[k] for k in REFERENCES if r.get(k)), r) for r in mine if any(r.get(k) for k in REFERENCES)]
        over = sorted((ms / r["floor_ms"], r["name"]) for ms, r in refs if ms / r["floor_ms"] > goal)
        log(f"{family:26s} {len(mine):3d} cells: ours at the goal {len(met):3d}; fastest reference over it "
            f"{len(over):3d}" + (f" (worst {over[-1][0]:.2f}x, {over[-1][1]})" if over else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid-json", help="kernels_h200.py --grid's JSON: the cells, their floors and our times")
    parser.add_argument("--min-floor-us", type=float, default=10.0, help="cells with a smaller floor are left out")
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"), help="folder for JSON and log")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--flush", choices=("write", "read"), default=kb.FLUSH,
                        help="how L2 is emptied before each timed replay (kernel_bench.FLUSH): the grid JSON's")
    args = parser.parse_args()
    if not args.dry_run and args.grid_json is None:
        parser.error("--grid-json is needed: the floors and our times come from a grid run on the same start")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    kb.FLUSH = args.flush
    if args.dry_run:
        kb.DEVICE = "cpu"
    g = kb.DRY_GRID if args.dry_run else kb.GRID
    pairs = grid_rows(args.grid_json, 0.0 if args.dry_run else args.min_floor_us, g)
    if not args.dry_run:  # after the grid JSON: a file it cannot read is named first
        kb.require_gpu("at_size_h200.py", has_dry_run=True)
    env = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "triton": triton.__version__,
           "device": torch.cuda.get_device_name(0) if kb.DEVICE == "cuda" else "cpu (dry run)",
           "cudnn": torch.backends.cudnn.version() if kb.DEVICE == "cuda" else None, "grid_json": args.grid_json,
           "flush": kb.FLUSH}
    log("env", json.dumps(env))
    bounds = boundaries_us(2 if args.dry_run else 64)
    rows = []
    for c, grid_row in pairs:
        row = {"family": c.family, "name": c.name, "floor_ms": grid_row["floor_ms"], "ms": grid_row.get("ms"),
               **measure(c, kb.cell_layers(c, g), grid_row["floor_ms"])}
        rows.append(row)
        log(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}))
    report(rows, bounds)
    log(f"total {time.time() - t0:.0f} s")
    with open(os.path.join(args.out, "at_size_h200.json"), "w") as f:
        json.dump({"env": env, "boundaries": bounds, "rows": rows, "seconds": time.time() - t0}, f, indent=1)
    with open(os.path.join(args.out, "at_size_h200.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
