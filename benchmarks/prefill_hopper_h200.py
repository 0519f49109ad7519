"""The Hopper prefill (Gluon: memcheck/kernels/prefill_hopper.py) on an H200, in one device call: its answers against the
float32 reference and Triton's kernel (memcheck/kernels/prefill.py, hopper off) on shapes that exercise it (ragged prompts and
chunks on cached prefixes, query tiles cut by a sequence's end, cache blocks of 16 to 256 tokens, GQA groups of 1 to
7, fp16, both launch orders, a cache whose unwritten slots hold NaN), then its time beside Triton's and torch SDPA's
(flash, on a contiguous cache) on the kernels' grid's dense prefill cells, timed as kernels_h200.py times them (CUDA-graph
replays, L2 flushed). Triton's interpreter cannot run Gluon: tests/gpu runs these checks as tests (pytest -m gpu).

    PYTHONUNBUFFERED=1 python benchmarks/prefill_hopper_h200.py [--out DIR] [--cells 1x2K 8x2K 2Kon30K ...]
        [--variants hopper ...] [--rounds N]

--rounds N times every variant N times, alternately (hopper, ..., triton, then again), and gives each its
median: variants a few percent apart are compared on the same minutes of the machine, not one after another.

Writes prefill_hopper_h200.json to DIR ($OUT on the device machine) and prints a short table last.
"""
import argparse
import os
import re
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402
from check_run import check_then_time  # noqa: E402
from kernel_bench import Cell, bench_graph, rel_err  # noqa: E402
from memcheck.kernels import mla_mha, prefill, reference  # noqa: E402

BOUND = kb.BF16_BOUND  # relative error of a bf16 output against the float32 reference
HOPPER = {"hopper": True}
TRITON = {"hopper": False}
# the Gluon kernel checked and timed beside Triton's; hopper-again: the default once more, last, so that a drift of the
# machine within the run shows (what was tried and dropped: docs/kernel-decisions.md)
VARIANTS = {"hopper": HOPPER, "hopper-again": HOPPER}
TIMED = dict(VARIANTS)  # the variants this run checks and times (--variants)
ROUNDS = 1
# (query heads, KV heads, [(sequence length, new tokens)], cache block size, dtype, tiles_first)
CHECKS = [
    (28, 4, [(2048, 2048)], 16, torch.bfloat16, None),
    (28, 4, [(1000, 1000), (5000, 300), (17, 17), (130, 1), (4097, 4097), (700, 129)], 16, torch.bfloat16, None),
    (28, 4, [(1000, 1000), (5000, 300), (17, 17), (130, 1), (4097, 4097), (700, 129)], 16, torch.bfloat16, True),
    (32, 8, [(3000, 3000), (2500, 2000)], 32, torch.bfloat16, None),
    (32, 32, [(1500, 1500), (999, 200)], 64, torch.float16, None),
    (8, 1, [(3333, 3333), (260, 260)], 256, torch.bfloat16, False),
    (28, 4, [(8192, 8192)], 16, torch.bfloat16, None),
]
CELLS = ["1x2K", "1x8K", "1x32K", "8x2K", "2Kon30K", "mla16h4K", "mla16h32K", "mla128h4K", "mla128h32K"]
# MLA prefill, decompressed (memcheck/kernels/mla_mha.py): (heads, [(sequence length, new tokens)], context tokens decompressed
# at a time: None for mla_mha's own, which holds these whole), DeepSeek's widths
RAGGED = [(1000, 1000), (3000, 200), (17, 17), (130, 1), (700, 129)]
MLA_CHECKS = [(16, [(4096, 4096)], None), (16, RAGGED, None), (128, [(2000, 2000), (600, 300)], None),
              (16, RAGGED, 1000), (128, [(2000, 2000), (600, 300)], 700)]  # windows that cut sequences


def poisoned_cache(table, lengths, num_blocks, block_size, kv_heads, dtype):
    """K or V with random rows at every sequence's tokens and NaN everywhere else (spare blocks, the slots past each
    sequence's end): a kernel that lets an unwritten slot reach its output fails the check."""
    cache = torch.full((num_blocks, block_size, kv_heads, 128), float("nan"), device="cuda", dtype=dtype)
    for i, n in enumerate(lengths):
        toks = torch.arange(n, device="cuda")
        blocks = table[i].long()[toks // block_size]
        cache[blocks, toks % block_size] = torch.randn(n, kv_heads, 128, device="cuda", dtype=dtype)
    return cache


def check(q_heads, kv_heads, seqs, block_size, dtype, tiles_first, gen):
    lengths, new = [n for n, _ in seqs], [q for _, q in seqs]
    table, num_blocks = kb.scattered_tables(lengths, gen, block_size)
    k, v = (poisoned_cache(table, lengths, num_blocks, block_size, kv_heads, dtype) for _ in range(2))
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0] + new, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    q = torch.randn(sum(new), q_heads, 128, device="cuda", dtype=dtype)
    scale = 128 ** -0.5

    def run(cfg):
        out = torch.full_like(q, float("nan"))
        return prefill.paged_prefill(q, k, v, table, cu, seq_lens, scale, max_q_len=max(new), out=out,
                                     config={**cfg, "tiles_first": tiles_first})

    ref = reference.paged_prefill(q.float(), k.float(), v.float(), table, cu, seq_lens, scale)
    row = {"heads": f"{q_heads}/{kv_heads}", "seqs": seqs, "block_size": block_size, "dtype": str(dtype)[6:],
           "tiles_first": tiles_first, "triton_rel_err": rel_err(run(TRITON), ref)}
    for name, cfg in TIMED.items():
        row[f"{name}_rel_err"] = rel_err(run(cfg), ref)  # NaN where any NaN got out
    row["ok"] = all(row[f"{name}_rel_err"] < BOUND for name in TIMED)
    return row


def mla_check(heads, seqs, window, gen):
    """The decompressed MLA prefill against the float32 reference and Triton's kernel: the latent cache paged in
    16-token blocks, kv_b_proj random (scaled as kernels_h200's cell), the context in windows of `window` tokens."""
    lengths, new = [n for n, _ in seqs], [q for _, q in seqs]
    table, num_blocks = kb.scattered_tables(lengths, gen, 16)
    cache = torch.randn(num_blocks, 16, 576, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0] + new, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    q = torch.randn(sum(new), heads, 192, device="cuda", dtype=torch.bfloat16)
    q_nope, q_pe = q.split([128, 64], dim=-1)  # the stack's views of one projection
    kv_b = torch.randn(heads * 256, 512, device="cuda", dtype=torch.bfloat16) * 512 ** -0.5
    scale = 192 ** -0.5

    def run(cfg):
        out = torch.full((sum(new), heads, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        return mla_mha.mla_mha_prefill(q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale, max(new), out=out,
                                       config=cfg, window=window)

    ref = reference.mla_mha_prefill(q_nope.float(), q_pe.float(), cache.float(), table, cu, seq_lens, kv_b.float(),
                                    scale)
    row = {"heads": f"MLA {heads}h", "seqs": seqs, "window": window, "block_size": 16, "dtype": "bfloat16",
           "triton_rel_err": rel_err(run(TRITON), ref)}
    for name, cfg in TIMED.items():
        row[f"{name}_rel_err"] = rel_err(run(cfg), ref)
    row["ok"] = all(row[f"{name}_rel_err"] < BOUND for name in TIMED)
    return row


def cell(name):
    """<batch>x<prompt>K (a causal prompt, as 8x2K) or <new>Kon<prefix>K (a chunk on a cached prefix, as 2Kon30K):
    a GQA 28/4 prefill cell of the kernels' grid; mla<heads>h<prompt>K a decompressed MLA prefill one (argparse's type:
    a bad name is a usage error)."""
    prompt = re.fullmatch(r"(\d+)x(\d+)K", name)
    chunk = re.fullmatch(r"(\d+)Kon(\d+)K", name)
    mla = re.fullmatch(r"mla(\d+)h(\d+)K", name)
    if mla:
        heads, n = int(mla[1]), int(mla[2]) * 1024
        rank, rope, qk, v = kb.GRID["rank"], kb.GRID["rope"], *kb.GRID["mla_prefill"][2:]
        return Cell(kb.MLA_MHA_PREFILL, 1, n, n, heads, 1, rank, rope, (qk, v))
    if prompt:
        batch, context, new = int(prompt[1]), int(prompt[2]) * 1024, int(prompt[2]) * 1024
    elif chunk:
        batch, context, new = 1, (int(chunk[1]) + int(chunk[2])) * 1024, int(chunk[1]) * 1024
    else:
        raise argparse.ArgumentTypeError(f"{name!r} is not a cell: <batch>x<prompt>K or <new>Kon<prefix>K")
    return Cell(kb.PREFILL, batch, context, new, 28, 4, 128)


def time_cell(c, bandwidth, rate, gen):
    floor = kb.floor_ms(kb.traffic_bytes(c), kb.attention_flops(c), bandwidth, rate)
    build = kb.BUILDERS[c.family](c, 1, gen)
    triton_out = build["output_with"](TRITON)
    replays = kb.replays_for(floor)
    row = {"cell": c.name, "floor_ms": floor}
    timed = {**TIMED, "triton": TRITON}
    runs = {name: build["with_config"](cfg) for name, cfg in timed.items()}
    times = {name: [] for name in timed}
    for _ in range(ROUNDS):  # alternately: every variant once a round
        for name, fn in runs.items():
            times[name].append(bench_graph(fn, replays))
    for name, cfg in timed.items():
        ms = statistics.median(times[name])
        row.update({f"{name}_ms": ms, f"{name}_x": ms / floor})
        if ROUNDS > 1:
            row[f"{name}_rounds_ms"] = times[name]
        if name != "triton":
            row[f"{name}_rel_err_vs_triton"] = rel_err(build["output_with"](cfg), triton_out)
    sdpa, _ = kb.time_sdpa(build["sdpa"], floor, replays)
    row.update({"sdpa_ms": sdpa["ms"], "sdpa_x": sdpa["ms"] / floor, "sdpa_backend": sdpa["backend"]})
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"))
    parser.add_argument("--cells", nargs="*", type=cell, default=[cell(name) for name in CELLS],
                        help="prefill cells to time, as 1x32K, 8x2K or 2Kon30K (GQA 28/4), mla16h4K (decompressed MLA)")
    parser.add_argument("--checks", type=int, default=len(CHECKS) + len(MLA_CHECKS), help="run the first N checks only")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                        help="the Gluon configs to check and time (the first is the one Triton is compared with)")
    parser.add_argument("--rounds", type=int, default=1, help="time every variant this many times, alternately")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    global ROUNDS
    ROUNDS = args.rounds
    TIMED.clear()
    TIMED.update({name: VARIANTS[name] for name in args.variants})
    kb.require_gpu("prefill_hopper_h200.py")
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    checks = [(f"{spec[:2]} {spec[2]}", lambda spec=spec: check(*spec, gen)) for spec in CHECKS]
    checks += [(f"MLA {spec[0]}h {spec[1]}", lambda spec=spec: mla_check(*spec, gen)) for spec in MLA_CHECKS]
    result = check_then_time(os.path.join(args.out, "prefill_hopper_h200.json"), checks[:args.checks], args.cells,
                             time_cell, gen)
    if result is None:
        return 1
    names = [*TIMED, "triton", "sdpa"]
    print(f"{'prefill cell':36} {'floor ms':>9}" + "".join(f"{n + ' ms':>11} {'x':>6}" for n in names)
          + f" {'triton / ' + names[0]:>16}")
    for r in result["cells"]:
        times = "".join(f"{r[n + '_ms']:11.3f} {r[n + '_x']:6.2f}" for n in names)
        print(f"{r['cell']:36} {r['floor_ms']:9.3f}{times} {r['triton_ms'] / r[names[0] + '_ms']:16.2f}")
    return 0 if all(r["ok"] for r in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
