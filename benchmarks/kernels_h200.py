"""Paged-attention kernels on the H200, in one device call: correctness at production sizes
against a float32 reference, then median times against the floor (KV bytes read once / copy
bandwidth measured in this run) and against torch SDPA on a contiguous cache.

    PYTHONUNBUFFERED=1 python benchmarks/kernels_h200.py [--sweep] [--out DIR]
    PYTHONUNBUFFERED=1 python benchmarks/kernels_h200.py --grid [--max-seconds 480] [--out DIR]
    TRITON_INTERPRET=1 python benchmarks/kernels_h200.py [--grid] --dry-run   # CPU smoke test of this script

Blocks of 16 tokens scattered at random over the cache, head_dim 128, bf16. --sweep also times
kernel configs and partition sizes around the defaults (the tuning run). Writes
kernels_h200.json and kernels_h200.log to DIR ($OUT on the device machine) and prints a short
table last.

--grid measures the kernels' range through the entry points the paged stack calls (kernels.mla_decode,
paged_decode, paged_prefill, mla_mha_prefill, mla_prefill), in its layouts: MLA decode at 16 and 128 heads (512
+ 64), dense decode at GQA 28/4, GQA 32/8 and MHA 32/32 (head_dim 128), each at batch 1-256 x context 1K-128K
(cells whose cache would pass 60 GB are skipped and listed), plus one 64K MLA sequence; prefill (R1's GQA 28/4)
of one 2K / 8K / 32K prompt, 8 x 2K, 2K new tokens on a 30K cached prefix, and MLA prefill (decompressed, the
stack's; absorbed, its form for few new tokens on a long prefix) at 16 and 128 heads, each beside torch SDPA
(flash where it takes the shape) on a contiguous cache. Floor = max(bytes moved once: cache and queries read,
output written / copy bandwidth, FLOPs / bf16 torch.mm rate), both rates measured at the start (MLA prefill's
FLOPs are those of the decompressed 192-wide q/k, 128-wide v: the least work for that problem). Every cell is
timed as CUDA-graph replays with L2 flushed before each; a decode cache under 160 MB is timed as that many bytes
of layers' caches, one call each, as in a decode step (the time given is per call), so cells with a floor of a
few us mostly measure the two launches (the summary also gives the worst cell with a floor of 10 us or more). A
few cells are checked against the float32 reference; quoted vLLM numbers (VLLM_QUOTED) sit beside the cells they
describe (vLLM is not measured here). Cells run the quoted table's rows first, then the rest smallest first; no
cell starts past --max-seconds, and the JSON is rewritten after every cell. Estimated H200 wall time of the 99
cells: about 3 min (estimate_seconds: 25 s to start, 42 Triton compiles at ~2 s, 0.5 s of set-up a cell, 13 s of
replays, 10 s of fp32 checks), so the grid is not trimmed; the budget's default leaves the 10-minute device call
2 minutes of margin.

--config-sweep [SWEEP ...] also times kernel configs (SWEEPS, every one unless named) on some grid cells, each
variant checked against the default's output, and prints a table per sweep, best worst case first: dense prefill's
(32), MLA prefill's absorbed (8) and decompressed (24) on their prefill cells, MLA decode's (8 at 16 heads, 5 at 128)
at 1K and 4K for 8, 32 and 256 sequences and on one long sequence (64K at 16 heads, 128K at 128), dense decode's
(8) on six cells (swept_decode_cells). Estimated at about 5 more minutes for all (~150 compiles at ~2 s, ~60 s of
replays).

--combine-programs-per-sm N times decode with its combine split until it has N programs a multiprocessor (the
default's alternatives, side by side with a grid run at the default). --decode-maxnreg N caps dense decode's
registers (more programs a multiprocessor). --flush read empties L2 before each replay by reading 256 MB
rather than zeroing it (FLUSH: zeroing leaves dirty lines the timed kernels write back).
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402
from kernel_bench import (ATTENTION_KERNELS, BF16_BOUND, BLOCK, BUILDERS, DECODE, DRY_GRID, DTYPE, FAMILIES,  # noqa: E402
                          FAMILY_KEYS, GRID, H200_COPY_BPS, H200_MM_FLOPS, MLA_DECODE, MLA_FAMILIES, MLA_MHA_PREFILL,
                          MLA_PREFILL, PREFILL, PREFILLS, SDPA, all_cells, attention_flops, bench, bench_graph,
                          cache_bytes, cell_layers, contiguous, copy_bandwidth, floor_ms, log, matmul_rate,
                          poisoned, rel_err, replays_for, require_gpu, scattered_tables, time_sdpa, tokens,
                          traffic_bytes)
from memcheck import kernels  # noqa: E402
from memcheck.kernels import decode, dispatch, mla, mla_mha, prefill, reference, work_split  # noqa: E402

HEAD_DIM = 128


DECODE_SHAPES = [  # name, sequences, context (or "mixed" up to), q heads, kv heads
    ("64x4K GQA 32/8", 64, 4096, 32, 8, False),
    ("16x32K GQA 28/4", 16, 32768, 28, 4, False),
    ("128x2K MHA 32/32", 128, 2048, 32, 32, False),
    ("64x mixed<=8K GQA 32/8", 64, 8192, 32, 8, True),
]


MLA_SHAPE = ("64x4K MLA V2-Lite 16h 512+64", 64, 4096, 16, 512, 64)


VLLM = {"64x4K GQA 32/8": 1.17, "16x32K GQA 28/4": 1.81, "128x2K MHA 32/32": 1.13, "64x mixed<=8K GQA 32/8": 1.71}


# --sweep: configs timed beside the default, each at the one-wave grid (x1) and twice it (x2).
DECODE_SWEEP = [
    (dict(block_n=64, num_warps=4, num_stages=3), (2,)),
    (dict(block_n=64, num_warps=4, num_stages=3, maxnreg=128), (1,)),
    (dict(block_n=32, num_warps=4, num_stages=3, maxnreg=128), (1,)),
]


MLA_SWEEP = [
    (dict(block_n=32, num_warps=4, num_stages=2, head_block=16, maxnreg=168), (2,)),
    (dict(block_n=32, num_warps=4, num_stages=2, head_block=16, maxnreg=None), (1,)),
    (dict(block_n=32, num_warps=4, num_stages=3, head_block=16, maxnreg=168), (1,)),
    (dict(block_n=32, num_warps=4, num_stages=2, head_block=16, maxnreg=152), (1,)),
    (dict(block_n=64, num_warps=8, num_stages=2, head_block=16, maxnreg=128), (1,)),
]


def run_decode(shape, bw, sweep, gen):
    name, num_seqs, ctx, hq, hkv, mixed = shape
    if mixed:
        lengths = torch.randint(1, ctx + 1, (num_seqs,), generator=gen).tolist()
    else:
        lengths = [ctx] * num_seqs
    table, num_blocks = scattered_tables(lengths, gen)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=kb.DEVICE)
    k_cache = torch.randn(num_blocks, BLOCK, hkv, HEAD_DIM, device=kb.DEVICE, dtype=DTYPE)
    v_cache = torch.randn(num_blocks, BLOCK, hkv, HEAD_DIM, device=kb.DEVICE, dtype=DTYPE)
    q = torch.randn(num_seqs, hq, HEAD_DIM, device=kb.DEVICE, dtype=DTYPE)
    scale = HEAD_DIM ** -0.5
    kv_bytes = sum(lengths) * hkv * HEAD_DIM * 2 * DTYPE.itemsize
    floor_ms = kv_bytes / bw * 1e3
    row = {"shape": name, "num_seqs": num_seqs, "context": ctx, "q_heads": hq, "kv_heads": hkv,
           "mixed": mixed, "tokens": sum(lengths), "kv_bytes": kv_bytes, "floor_ms": floor_ms}

    # Correctness first: the public entry point, into a poisoned buffer, against fp32 math.
    ref = reference.paged_decode(q.float(), k_cache.float(), v_cache.float(), table, seq_lens, scale)
    out = decode.paged_decode(q, k_cache, v_cache, table, seq_lens, scale, out=poisoned(q))
    row["rel_err"] = rel_err(out, ref)
    row["rel_err_public"] = rel_err(kernels.paged_decode(q, k_cache, v_cache, table, seq_lens, scale), ref)
    row["ok"] = row["rel_err"] < BF16_BOUND and row["rel_err_public"] < BF16_BOUND
    row["programs"] = resident_of(decode._decode, decode.DEFAULT_CONFIG)
    for name_, kw in (("7_programs", dict(num_programs=7)), ("x2_programs", dict(num_programs=2 * row["programs"]))):
        other = decode.paged_decode(q, k_cache, v_cache, table, seq_lens, scale, out=poisoned(q), **kw)
        row["rel_err_" + name_] = rel_err(other, ref)
        row["ok"] &= row["rel_err_" + name_] < BF16_BOUND
    del ref, other

    def call(**kw):
        return lambda: decode.paged_decode(q, k_cache, v_cache, table, seq_lens, scale, **kw)

    row["ms"] = bench(lambda: kernels.paged_decode(q, k_cache, v_cache, table, seq_lens, scale))
    row["ms_again"] = bench(lambda: kernels.paged_decode(q, k_cache, v_cache, table, seq_lens, scale))
    row["ms_graph"] = bench_graph(call())
    row["x_floor"] = row["ms"] / floor_ms
    row["gbps"] = kv_bytes / row["ms"] / 1e6

    if not mixed:  # SDPA over a contiguous copy of the same K/V
        kc, vc = contiguous(k_cache, table, ctx), contiguous(v_cache, table, ctx)
        q4 = q.unsqueeze(2)
        try:
            sd = F.scaled_dot_product_attention(q4, kc, vc, scale=scale, enable_gqa=hq != hkv)
            row["sdpa_rel_err_vs_ours"] = rel_err(sd.squeeze(2), out)
            row["sdpa_ms"] = bench(lambda: F.scaled_dot_product_attention(q4, kc, vc, scale=scale,
                                                                         enable_gqa=hq != hkv))
        except Exception as e:  # noqa: BLE001 - record, keep going
            row["sdpa_error"] = repr(e)[:200]
        del kc, vc

    if sweep:
        def resident(cfg):
            call(config=cfg)()
            return resident_of(decode._decode, cfg)

        row["sweep"] = time_variants(call, DECODE_SWEEP, floor_ms, resident)
    del k_cache, v_cache
    if kb.DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


def time_variants(call, variants, floor_ms, resident):
    """Time every (config, grid multiples) variant."""
    rows = []
    for cfg, multiples in variants:
        for times in multiples:
            row = {**cfg, "grid_x": times}
            try:
                row["ms"] = bench(call(config=cfg, num_programs=times * resident(cfg)))
                row["x_floor"] = row["ms"] / floor_ms
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                row["error"] = repr(e)[:300]
            rows.append(row)
            log("  ", json.dumps(row))
    return rows


def resident_of(kernel, cfg):
    """The one-wave grid size the launcher computed for this kernel and config (dispatch's cache)."""
    if kb.DEVICE == "cpu":
        return 4  # dispatch.sm_count under the interpreter
    for (fn, key, _), programs in dispatch._RESIDENT.items():
        consts = dict(key[0])
        if fn is kernel and all(consts.get(name) == cfg.get(field) for name, field in (
                ("BLOCK_N", "block_n"), ("num_warps", "num_warps"), ("num_stages", "num_stages"),
                ("maxnreg", "maxnreg"))):
            return programs
    raise KeyError(cfg)


def run_mla(bw, sweep, gen):
    name, num_seqs, ctx, heads, rank, rope = MLA_SHAPE
    lengths = [ctx] * num_seqs
    table, num_blocks = scattered_tables(lengths, gen)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=kb.DEVICE)
    cache = torch.randn(num_blocks, BLOCK, rank + rope, device=kb.DEVICE, dtype=DTYPE)
    q_lat = torch.randn(num_seqs, heads, rank, device=kb.DEVICE, dtype=DTYPE)
    q_pe = torch.randn(num_seqs, heads, rope, device=kb.DEVICE, dtype=DTYPE)
    scale = (128 + 64) ** -0.5
    kv_bytes = sum(lengths) * (rank + rope) * DTYPE.itemsize
    floor_ms = kv_bytes / bw * 1e3
    row = {"shape": name, "num_seqs": num_seqs, "context": ctx, "q_heads": heads, "kv_heads": 1, "mixed": False,
           "tokens": sum(lengths), "kv_bytes": kv_bytes, "floor_ms": floor_ms}
    ref = reference.mla_decode(q_lat.float(), q_pe.float(), cache.float(), table, seq_lens, scale)
    out = mla.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, out=poisoned(q_lat))
    row["rel_err"] = rel_err(out, ref)
    row["rel_err_public"] = rel_err(kernels.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale), ref)
    row["programs"] = resident_of(mla._mla_decode, mla.DEFAULT_CONFIG)
    row["ok"] = max(row["rel_err"], row["rel_err_public"]) < BF16_BOUND
    for name_, kw in (("7_programs", dict(num_programs=7)), ("x2_programs", dict(num_programs=2 * row["programs"]))):
        other = mla.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, out=poisoned(q_lat), **kw)
        row["rel_err_" + name_] = rel_err(other, ref)
        row["ok"] &= row["rel_err_" + name_] < BF16_BOUND
    del ref, other

    def call(**kw):
        return lambda: mla.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, **kw)

    row["ms"] = bench(lambda: kernels.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale))
    row["ms_again"] = bench(lambda: kernels.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale))
    row["ms_graph"] = bench_graph(call())
    row["x_floor"] = row["ms"] / floor_ms
    row["gbps"] = kv_bytes / row["ms"] / 1e6

    # SDPA on a contiguous latent: K = the 576-wide rows, V = their first 512, one KV head shared.
    kc = contiguous(cache, table, ctx)  # [S, 1, L, 576]
    vc = kc[..., :rank]
    q4 = torch.cat([q_lat, q_pe], -1).unsqueeze(2)
    try:
        sd = F.scaled_dot_product_attention(q4, kc, vc, scale=scale, enable_gqa=True)
        row["sdpa_rel_err_vs_ours"] = rel_err(sd.squeeze(2), out)
        row["sdpa_ms"] = bench(lambda: F.scaled_dot_product_attention(q4, kc, vc, scale=scale, enable_gqa=True))
    except Exception as e:  # noqa: BLE001
        row["sdpa_error"] = repr(e)[:200]
    del kc, vc

    if sweep:
        def resident(cfg):
            call(config=cfg)()
            return resident_of(mla._mla_decode, cfg)

        row["sweep"] = time_variants(call, MLA_SWEEP, floor_ms, resident)
    return row


def check_prefill_and_write(gen):
    """Not timed: chunked prefill (variable lengths, cached prefixes) and cache writes, checked at
    production head sizes against the fp32 reference, K/V written through kernels.write_kv."""
    hq, hkv, d = (32, 8, HEAD_DIM)
    prefix = [0, 1000, 3000, 517] if kb.DEVICE == "cuda" else [0, 10, 30, 5]
    new = [2048, 512, 77, 1] if kb.DEVICE == "cuda" else [20, 5, 7, 1]
    lengths = [p + n for p, n in zip(prefix, new)]
    table, num_blocks = scattered_tables(lengths, gen)
    k_cache = torch.full((num_blocks, BLOCK, hkv, d), float("nan"), device=kb.DEVICE, dtype=DTYPE)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_all = torch.randn(sum(lengths), hkv, d, device=kb.DEVICE, dtype=DTYPE)
    v_all = torch.randn_like(k_all)
    slots = torch.cat([(table[i, torch.arange(n, device=kb.DEVICE) // BLOCK].long() * BLOCK
                        + torch.arange(n, device=kb.DEVICE) % BLOCK) for i, n in enumerate(lengths)])
    kernels.write_kv(k_all, v_all, k_cache, v_cache, slots)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    reference.write_kv(k_all, v_all, k_ref, v_ref, slots)
    written = slots.unique()
    flat = lambda c: c.flatten(0, 1)[written]  # noqa: E731
    write_ok = torch.equal(flat(k_cache), flat(k_ref)) and torch.equal(flat(v_cache), flat(v_ref))
    cu = torch.tensor([0] + new, device=kb.DEVICE).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=kb.DEVICE)
    q = torch.randn(sum(new), hq, d, device=kb.DEVICE, dtype=DTYPE)
    ref = reference.paged_prefill(q.float(), k_cache.float(), v_cache.float(), table, cu, seq_lens, d ** -0.5)
    out = kernels.paged_prefill(q, k_cache, v_cache, table, cu, seq_lens, d ** -0.5, max_q_len=max(new))
    # MLA: kv_a_proj's fp32 output normalised and rotated into a bf16 latent cache (the norm's sum may round
    # differently from torch's: equal slots, values within bf16 rounding)
    kv_a = torch.randn(sum(new), 576, device=kb.DEVICE)
    norm_w = torch.rand(512, device=kb.DEVICE) + 0.5
    angles = torch.rand(sum(new), 32, device=kb.DEVICE) * 6.3
    latent_cache = torch.full((num_blocks, BLOCK, 576), float("nan"), device=kb.DEVICE, dtype=DTYPE)
    latent_ref = latent_cache.clone()
    new_slots = torch.cat([slots[sum(lengths[:i]) + prefix[i]:sum(lengths[:i + 1])] for i in range(len(new))])
    args = (kv_a, norm_w, 1e-6, angles.cos(), angles.sin(), True)
    kernels.write_latent(*args, latent_cache, new_slots)
    reference.write_latent(*args, latent_ref, new_slots)
    write_ok &= torch.equal(latent_cache.isnan(), latent_ref.isnan()) and torch.allclose(
        latent_cache.float().nan_to_num(7.0), latent_ref.float().nan_to_num(7.0), rtol=1e-2, atol=1e-2)
    row = {"write_kv_exact": write_ok, "prefill_rel_err": rel_err(out, ref)}
    row["ok"] = write_ok and row["prefill_rel_err"] < BF16_BOUND
    if kb.DEVICE == "cuda":
        row["prefill_ms"] = bench(lambda: kernels.paged_prefill(q, k_cache, v_cache, table, cu, seq_lens,
                                                                d ** -0.5, max_q_len=max(new)))
    log("prefill + write_kv", json.dumps(row))
    return row


VLLM_SOURCE = "vLLM (quoted, an earlier run)"


# A quoted table (one H200 run before this grid existed: ours then, vLLM 0.32's Triton kernels then), each row with
# the grid cells it describes. Quoted, never measured here (the device has no vllm); no other cell gets a vLLM number.
VLLM_QUOTED = [
    {"case": "MLA, 16 heads (V2-Lite), batched 4K-32K", "ours_then": "1.66-1.76x of the bytes floor",
     "vllm_then": "3.5-4.3x", "cells": "the quote does not say which batch: every batched cell at 4K and 32K",
     "match": lambda c, g: c.family == MLA_DECODE and c.q_heads == g["mla_heads"][0] and c.batch > 1
     and c.context in g["contexts"][1:3]},
    {"case": "MLA, 128 heads (V2/V3), batched 4K", "ours_then": "5.9x of the FLOP floor", "vllm_then": "12.3x",
     "cells": "the quote does not say which batch: every batched cell at 4K",
     "match": lambda c, g: c.family == MLA_DECODE and c.q_heads == g["mla_heads"][1] and c.batch > 1
     and c.context == g["contexts"][1]},
    {"case": "MLA, one sequence of 64K", "ours_then": "27x (0.48 ms)", "vllm_then": "9.6x (0.17 ms)",
     "cells": "16 heads (the quoted 0.48 ms / 27x is the 16-head floor)",
     "match": lambda c, g: c.family == MLA_DECODE and c.q_heads == g["mla_heads"][0] and c.batch == 1
     and c.context == g["long_mla"]},
    {"case": "dense GQA, one sequence of 128K", "ours_then": "2.4x", "vllm_then": "10.5x", "cells": "R1's GQA 28/4",
     "match": lambda c, g: c.family == DECODE and (c.q_heads, c.kv_heads) == g["dense"][0] and c.batch == 1
     and c.context == g["contexts"][-1]},
    {"case": "dense GQA, a few hundred sequences of 1K", "ours_then": "1.38x", "vllm_then": "1.28x",
     "cells": "the quote does not say which GQA: both, at the largest batch",
     "match": lambda c, g: c.family == DECODE and c.q_heads != c.kv_heads and c.batch == g["batches"][-1]
     and c.context == g["contexts"][0]},
]


# --config-sweep: configs around each kernel's defaults, timed on the cells `sweep_of` picks (the sweeps that chose
# the defaults: a query head per program for dense prefill, tiles for MLA prefill and 128-head MLA decode, min_tiles
# for 16-head MLA decode).
SWEEPS = {  # key (--config-sweep's names): (title, the default it varies, the configs)
    # rows, key tile, warps, stages, launch order: the default (its order by the grid's waves) and its neighbours; each
    # order forced; two programs a multiprocessor (64 rows on one warpgroup, 64-key tiles: one program's exponentials
    # beside the other's products). (The next tile scored ahead of the exponentials: docs/kernel-decisions.md.)
    # The Gluon kernel (hopper, the default on sm_90) with each order forced, then Triton's configs.
    "prefill": (PREFILL, prefill.CONFIG, [{**prefill.CONFIG, "tiles_first": order} for order in (True, False)]
                + [{**prefill.CONFIG, "hopper": False, "rows": rows, "block_n": block_n, "num_warps": warps,
                    "num_stages": stages, "tiles_first": tiles_first}
                   for rows, block_n, warps, stages, tiles_first in (
                       (128, 128, 8, 3, None), (128, 128, 8, 3, True), (128, 128, 8, 3, False), (128, 128, 8, 2, None),
                       (128, 64, 8, 3, None), (64, 64, 4, 3, None), (64, 64, 4, 2, None))]),
    "mla-prefill": (MLA_PREFILL, mla.PREFILL_CONFIG, [
        {"rows": 32, "block_n": block_n, "num_warps": warps, "num_stages": stages}
        for block_n in (64, 128) for warps in (4, 8) for stages in (1, 2)]),
    "mla-mha-prefill": (MLA_MHA_PREFILL, mla_mha.CONFIG, [
        {**mla_mha.CONFIG, "hopper": False, "block_m": block_m, "block_n": block_n, "num_warps": warps,
         "num_stages": stages}
        for block_m in (64, 128) for block_n in (32, 64, 128) for warps in (4, 8) for stages in (2, 3)]),
    # key tile, stages, register cap, min_tiles: the default; more programs a multiprocessor (Nsight Compute at b256 x
    # 4K: 74% of the DRAM bandwidth, 3 programs of 4 warps at 168 registers) or deeper pipelines
    "mla-decode-16": ("MLA decode, 16 heads", mla.DEFAULT_CONFIG, [
        {**mla.DEFAULT_CONFIG, "block_n": block_n, "num_stages": stages, "maxnreg": maxnreg, "min_tiles": min_tiles}
        for block_n, stages, maxnreg, min_tiles in ((32, 2, 168, 2), (32, 2, 128, 2), (32, 3, 168, 2), (32, 3, 128, 2),
                                                    (32, 2, None, 2), (16, 2, 128, 2), (32, 2, 168, 4),
                                                    (64, 2, 168, 2))]),
    # key tile, warps, stages, register cap: the default; then more programs a multiprocessor (Nsight Compute at GQA
    # 28/4 b32 x 1K: 161 registers, 3 programs of 4 warps, 56% of the DRAM bandwidth), deeper pipelines, other tiles
    "decode": ("paged decode", decode.DEFAULT_CONFIG, [
        {**decode.DEFAULT_CONFIG, "block_n": block_n, "num_warps": warps, "num_stages": stages, "maxnreg": maxnreg}
        for block_n, warps, stages, maxnreg in ((64, 4, 2, None), (64, 4, 3, None), (64, 4, 3, 128),
                                                (64, 4, 2, 128), (32, 4, 2, None), (32, 4, 4, 128), (64, 4, 4, None),
                                                (128, 4, 2, None))]),
    # head block, key tile, warps, stages, min_tiles, hopper: the default (memcheck/kernels/mla_seesaw.py on sm_90) and longer
    # ranges (a 64-head block's partial, 128 KiB, outweighs the 72 KiB latent tile); Triton's _mla_decode at 64-head
    # blocks on two warpgroups' wgmma (the default before the Gluon kernels) and at 32-head blocks on mma.sync
    "mla-decode-128": ("MLA decode, 128 heads", mla.MANY_HEADS_CONFIG, [
        {**mla.MANY_HEADS_CONFIG, "head_block": hb, "block_n": block_n, "num_warps": warps, "num_stages": stages,
         "min_tiles": min_tiles, "hopper": hopper}
        for hb, block_n, warps, stages, min_tiles, hopper in (
            (64, 64, 8, 2, 2, True), (64, 64, 8, 2, 4, True), (64, 64, 8, 2, 8, True), (64, 64, 8, 2, 2, False),
            (32, 64, 4, 2, 2, False))]),
}


def sweep_of(c, g):
    """The key of the sweep that covers cell c, or None: every prefill cell; MLA decode at 1K and 4K for the batches
    in swept_mla_batches (each batch size compiles its own variants: three keep the cost down; the contexts share
    them), and one long sequence (64K at 16 heads, 128K above)."""
    if c.family in PREFILLS:
        return next(key for key, family in FAMILY_KEYS.items() if family == c.family)  # a prefill's sweep: its key
    if c.family == DECODE:
        return "decode" if c.name in g["swept_decode_cells"] else None
    if c.family != MLA_DECODE:
        return None
    many = c.q_heads > 16
    one_long = c.batch == 1 and c.context == (g["contexts"][-1] if many else g["long_mla"])
    if c.context in g["contexts"][:2] and c.batch in g["swept_mla_batches"] or one_long:
        return "mla-decode-128" if many else "mla-decode-16"
    return None


EXPECTED_X = {MLA_DECODE: 4.0, DECODE: 1.5, PREFILL: 4.0 + 1.5, MLA_PREFILL: 7.0 + 1.6,  # prefill: ours + SDPA
              MLA_MHA_PREFILL: 3.0 + 1.6}


LAUNCH_MS, REPLAY_OVERHEAD_MS, FILL_BPS = 0.012, 0.2, 1e12


# imports, CUDA and the two rates; a cell's set-up (tables, capture, empty_cache); one kernel variant; one fp32 check
START_S, CELL_S, COMPILE_S, CHECK_S = 25.0, 0.5, 2.0, 1.0


def quoted_rank(c, g):
    """Where the quoted table (VLLM_QUOTED) puts the cell: its decode rows in order, then its prefill rows, then the
    rest."""
    for i, quote in enumerate(VLLM_QUOTED):
        if quote["match"](c, g):
            return i
    quoted_prefill = c.family in MLA_FAMILIES or c.family == PREFILL and (
        c.batch > 1 or c.new < c.context or c.context == g["prompts"][-1])
    return len(VLLM_QUOTED) + (0 if quoted_prefill else 1)


def grid_cells(g):
    """(cells to run, the quoted table's rows first and then the rest smallest cache first, so a budget cut drops the
    largest; [(cell, why)] for the cells whose cache is over the cap)."""
    cells, cap = all_cells(g), g["cap_bytes"]
    skipped = [(c, f"cache {cache_bytes(c) / 1e9:.3g} GB over the {cap / 1e9:.3g} GB cap")
               for c in cells if cache_bytes(c) > cap]
    kept = [c for c in cells if cache_bytes(c) <= cap]
    return sorted(kept, key=lambda c: (quoted_rank(c, g), cache_bytes(c))), skipped


def estimate_seconds(cells, g, bandwidth=H200_COPY_BPS, rate=H200_MM_FLOPS):
    """The grid's wall time on an H200 from the costs above (one compile per kernel variant: Triton specialises
    decode on the padded batch)."""
    total, variants = START_S + CELL_S * len(cells), set()
    for c in cells:
        layers = cell_layers(c, g)
        floor = floor_ms(traffic_bytes(c), attention_flops(c), bandwidth, rate)
        replay_ms = layers * max(EXPECTED_X[c.family] * floor, LAUNCH_MS) + REPLAY_OVERHEAD_MS
        total += (replays_for(floor * layers) + 3) * replay_ms / 1e3  # + the warm-up, capture and checked calls
        total += layers * cache_bytes(c) / FILL_BPS + (CHECK_S if c.check else 0.0)
        variant = (c.family, c.q_heads, c.kv_heads, max(16, dispatch.next_pow2(c.batch)))
        if variant not in variants:
            variants.add(variant)
            total += COMPILE_S * (2 if c.new == 1 else 1)  # decode: the kernel and its merge
    return total


def cell_row(c, g, bandwidth, rate):
    """What the cell is, its bytes, FLOPs and floor, and the issue's vLLM quote where one describes it."""
    moved, flops = traffic_bytes(c), attention_flops(c)
    row = {"family": c.family, "shape": c.shape, "case": c.case, "name": c.name, "batch": c.batch,
           "context": c.context, "new_tokens": c.new, "q_heads": c.q_heads, "kv_heads": c.kv_heads,
           "head_dim": c.head_dim, "rope": c.rope, "floor_dims": list(c.floor_dims), "cache_bytes": cache_bytes(c),
           "bytes": moved, "flops": flops, "layers": cell_layers(c, g),
           "floor_ms": floor_ms(moved, flops, bandwidth, rate),
           "floor_bound": "bytes" if moved / bandwidth >= flops / rate else "FLOPs"}
    for quote in VLLM_QUOTED:
        if quote["match"](c, g):
            row["vllm_quoted"] = {"source": VLLM_SOURCE, **{k: v for k, v in quote.items() if k != "match"}}
    return row


def sweep_configs(build, variants, out, floor, replays, layers):
    """Each config variant: its output against the default's (already checked), then its time (per layer, as the
    default's)."""
    rows = []
    for cfg in variants:
        row = dict(cfg)
        try:
            row["rel_err_vs_default"] = rel_err(build["output_with"](cfg), out)
            row["ms"] = bench_graph(build["with_config"](cfg), replays) / layers
            row["x_floor"] = row["ms"] / floor
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: recorded, the next variant runs
            row["error"] = repr(e)[:300]
        rows.append(row)
    return rows


def kernel_us(step, layers, calls=5):
    """Each kernel's GPU time per layer (us), from torch.profiler over a few eager calls: how a small decode's time
    splits between the attention kernel and the merge of its partials."""
    from torch.profiler import ProfilerActivity, profile

    if kb.DEVICE == "cpu":
        return {}
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / calls / layers, 2) for e in prof.key_averages() if e.device_time_total}


def run_grid_cell(c, g, bandwidth, rate, gen, sweeps=()):
    row = cell_row(c, g, bandwidth, rate)
    layers, floor = row["layers"], row["floor_ms"]
    build = BUILDERS[c.family](c, layers, gen)
    out = build["output"]()
    if c.check:
        row["rel_err"] = rel_err(out, build["reference"]())
        row["ok"] = row["rel_err"] < BF16_BOUND
    elif "reference_last_rows" in build:  # a whole fp32 reference is too big: the rows that see the most keys
        row["checked_rows"], ref = build["reference_last_rows"]()
        row["rel_err"] = rel_err(out[-row["checked_rows"]:], ref)
        row["ok"] = row["rel_err"] < BF16_BOUND
    replays = replays_for(floor * layers)
    row["ms"] = bench_graph(build["step"], replays) / layers
    row["x_floor"] = row["ms"] / floor
    if c.new == 1 and c.batch <= g["profiled_batch"] or c.family == MLA_MHA_PREFILL:
        try:
            row["kernel_us"] = kernel_us(build["step"], layers)
        except Exception as e:  # noqa: BLE001 - the profile is extra: its failure leaves the cell's time standing
            row["kernel_us_error"] = repr(e)[:200]
    key = sweep_of(c, g)
    if key in sweeps:
        row["sweep_name"] = key
        row["sweep"] = sweep_configs(build, SWEEPS[key][2], out, floor, replays, layers)
    if "sdpa" in build:
        try:
            row["sdpa"], sdpa_out = time_sdpa(build["sdpa"], floor, replays)
        except Exception as e:  # noqa: BLE001 - SDPA's failure is recorded beside ours, which stands
            row["sdpa_error"] = repr(e)[:300]
            return row
        if "sdpa_as_ours" in build:
            row["sdpa"]["rel_err_vs_ours"] = rel_err(build["sdpa_as_ours"](sdpa_out), out)
    return row


def run_grid(args, g, env, t0):
    bandwidth, rate = copy_bandwidth(), matmul_rate()
    log(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + write, device-to-device copy); "
        f"bf16 matmul {rate / 1e12:.1f} TFLOP/s (torch.mm, best run)")
    cells, skipped = grid_cells(g)
    if args.families:  # a part of the grid: the other families' cells are not run, nor listed
        wanted = {FAMILY_KEYS[key] for key in args.families}
        cells = [c for c in cells if c.family in wanted]
        skipped = [(c, why) for c, why in skipped if c.family in wanted]
    full, _ = grid_cells(GRID)
    estimate = estimate_seconds(full, GRID)
    log(f"grid: {len(cells)} cells, {len(skipped)} over the cache cap; the full grid ({len(full)} cells) is "
        f"estimated at {estimate / 60:.1f} min on an H200; --max-seconds {args.max_seconds}")
    rows = [{**cell_row(c, g, bandwidth, rate), "status": "skipped: " + why} for c, why in skipped]
    for c, why in skipped:
        log(f"skipped {c.family} {c.name}: {why}")
    gen = torch.Generator().manual_seed(0)
    result = {"env": env, "copy_bandwidth_Bps": bandwidth, "matmul_flops_per_s": rate, "grid": g,
              "estimate_s_h200": estimate, "vllm_quoted": [{k: v for k, v in q.items() if k != "match"}
                                                           for q in VLLM_QUOTED], "rows": rows}
    for c in cells:
        if time.time() - t0 > args.max_seconds:
            rows.append({**cell_row(c, g, bandwidth, rate), "status": "not run: past --max-seconds"})
            continue
        started = time.time()
        try:
            row = {**run_grid_cell(c, g, bandwidth, rate, gen, args.config_sweep or ()), "status": "ok"}
        except Exception as e:  # noqa: BLE001 - out of memory, a compile error: recorded, the grid goes on
            row = {**cell_row(c, g, bandwidth, rate), "status": "error", "error": repr(e)[:300]}
        row["seconds"] = time.time() - started
        rows.append(row)
        log(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()
                        if k not in ("vllm_quoted", "floor_dims", "sweep", "kernel_us")}))
        if kb.DEVICE == "cuda":
            torch.cuda.empty_cache()
        result["seconds"] = time.time() - t0
        write_results(args.out, result)  # after every cell: a call killed at its limit keeps what it measured
    grid_report(rows, g, bandwidth, rate)
    log(f"total {time.time() - t0:.0f} s")
    write_results(args.out, result)


def write_results(out_dir, result):
    with open(os.path.join(out_dir, "kernels_h200.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "kernels_h200.log"), "w") as f:
        f.write("\n".join(kb.LOG) + "\n")


def x_text(row):
    """A cell of the compact tables: x floor (* where the floor is FLOP-bound), or why there is no number."""
    if row["status"] != "ok":
        return {"skipped": "cap", "not run": "-", "error": "err"}[row["status"].split(":")[0]]
    return f"{row['x_floor']:.2f}{'*' if row['floor_bound'] == 'FLOPs' else ''}"


def summary_table(rows):
    """Per family: cells measured, the worst x floor and where, the median, and the worst among cells whose floor
    is at least 10 us (below it a decode is mostly its two launches)."""
    log(f"{'family':26s} {'cells':>9s} {'worst x':>8s}  {'at':34s} {'median':>7s}  worst where floor >= 10 us")
    prefills = [r for r in rows if r["family"] in PREFILLS]
    for family, planned in [(f, [r for r in rows if r["family"] == f]) for f in FAMILIES] + [(SDPA, prefills)]:
        measured = sorted((r["sdpa"]["x_floor"] if family == SDPA else r["x_floor"], r["name"], r["floor_ms"])
                          for r in planned if r["status"] == "ok" and (family != SDPA or "sdpa" in r))
        if not measured:
            log(f"{family:26s} {0:>4d} / {len(planned):<3d} none measured")
            continue
        worst = measured[-1]
        big = [m for m in measured if m[2] >= 0.010]
        big_worst = f"{big[-1][0]:.2f} ({big[-1][1]})" if big else "n/a"
        log(f"{family:26s} {len(measured):>4d} / {len(planned):<3d} {worst[0]:8.2f}  {worst[1]:34s} "
            f"{measured[len(measured) // 2][0]:7.2f}  {big_worst}")


def decode_table(rows, family, g):
    """Rows: shape and context, in the grid's order; columns: batch."""
    log(f"{family}, x floor by batch (cap: cache over {g['cap_bytes'] / 1e9:.3g} GB, skipped; -: not run)")
    log(f"{'shape, context':22s}" + "".join(f"{'b' + str(b):>9s}" for b in g["batches"]))
    by_name = {r["name"]: r for r in rows if r["family"] == family}
    lines = {}
    for c in all_cells(g):
        if c.family == family:
            lines.setdefault((c.shape, c.context), {})[c.batch] = by_name[c.name]
    order = list(dict.fromkeys(shape for shape, _ in lines))
    for shape, ctx in sorted(lines, key=lambda key: (order.index(key[0]), key[1])):
        cols = lines[(shape, ctx)]
        log(f"{shape + ' ' + tokens(ctx):22s}" + "".join(
            f"{x_text(cols[b]) if b in cols else '':>9s}" for b in g["batches"]))


def kernel_split_table(rows):
    """Single-sequence decode cells whose floor is 10 us or more: the time (graph replays) and each kernel's share
    (profiled eagerly, so the two need not add up)."""
    log("one sequence, decode: us per layer, graph replay, and each kernel's GPU time (torch.profiler, eager)")
    for r in rows:
        if r["status"] == "ok" and r.get("kernel_us") and r["batch"] == 1 and r["floor_ms"] >= 0.010:
            kernels_ = ", ".join(f"{k[:24]} {v:.1f}" for k, v in sorted(r["kernel_us"].items(), key=lambda kv: -kv[1]))
            log(f"  {r['family'] + ': ' + r['name']:40s} floor {r['floor_ms'] * 1e3:6.1f}  ours {r['ms'] * 1e3:6.1f}  "
                f"{kernels_}")


def mla_attention_table(rows):
    """The decompressed MLA prefill cells' time split: the cell times the stack's whole call (the context's latent
    gathered, decompressed by kv_b_proj, attended), the floor counts the attention's FLOPs, and SDPA is timed on
    tensors decompressed beforehand. The attention kernel's own GPU time (torch.profiler, eager) is what compares
    with SDPA's."""
    log("MLA prefill, decompressed: the whole call and its attention kernel alone (torch.profiler, eager) beside SDPA")
    log(f"{'case':28s} {'floor ms':>9s} {'whole ms':>9s} {'x':>6s} {'attention ms':>13s} {'x':>6s} {'SDPA ms':>8s} "
        f"{'x':>6s}  the rest (ms)")
    for r in rows:
        if r["family"] != MLA_MHA_PREFILL or r["status"] != "ok" or not r.get("kernel_us"):
            continue
        ours = {name: us for name, us in r["kernel_us"].items() if any(k in name for k in ATTENTION_KERNELS)}
        attention = sum(ours.values()) / 1e3
        rest = ", ".join(f"{k[:28]} {us / 1e3:.3f}" for k, us in sorted(r["kernel_us"].items(), key=lambda kv: -kv[1])
                         if k not in ours)
        sd = r.get("sdpa", {})
        theirs = f"{sd['ms']:8.3f} {sd['x_floor']:6.2f}" if sd else f"{'':8s} {'':6s}"
        log(f"{r['name']:28s} {r['floor_ms']:9.3f} {r['ms']:9.3f} {x_text(r):>6s} {attention:13.3f} "
            f"{attention / r['floor_ms']:6.2f} {theirs}  {rest}")


def prefill_table(rows, g):
    log("prefill over the paged cache (ours) and torch SDPA on a contiguous cache (its backend last), x floor")
    log(f"{'case':44s} {'floor ms':>9s} {'ours ms':>8s} {'x':>6s} {'SDPA ms':>8s} {'x':>6s} {'rel err':>8s}  SDPA")
    by_name = {(r["family"], r["name"]): r for r in rows}
    for c in all_cells(g):
        if c.family not in PREFILLS or (c.family, c.name) not in by_name:  # (not run: --families)
            continue
        r = by_name[(c.family, c.name)]
        sd = r.get("sdpa", {})
        ours = f"{r['ms']:8.3f}" if r["status"] == "ok" else f"{'':8s}"
        theirs = f"{sd['ms']:8.3f} {sd['x_floor']:6.2f}" if sd else f"{'':8s} {'':6s}"
        err = f"{r['rel_err']:8.1e}" if "rel_err" in r else f"{'':8s}"
        log(f"{r['family'] + ': ' + r['name']:44s} {r['floor_ms']:9.3f} {ours} {x_text(r):>6s} {theirs} {err}  "
            f"{sd.get('backend', r.get('sdpa_error', ''))}")


def grid_report(rows, g, bandwidth, rate):
    """The checks and the issue's vLLM quotes; then the short table: the summary per family, then one compact
    table per family, in x-floor units."""
    ok = [r for r in rows if r["status"] == "ok"]
    checked = [r for r in ok if "rel_err" in r]
    log("")
    log(f"float32 reference checks: {sum(r['ok'] for r in checked)} of {len(checked)} within {BF16_BOUND}: "
        + ", ".join(f"{r['name']}{' (last %d rows)' % r['checked_rows'] if 'checked_rows' in r else ''} "
                    f"{r['rel_err']:.1e}" for r in checked))
    log(f"{VLLM_SOURCE}, beside the cells they describe:")
    for quote in VLLM_QUOTED:
        matched = [r for r in ok if r.get("vllm_quoted", {}).get("case") == quote["case"]]
        now = ", ".join(f"{r['name']} {x_text(r)}" for r in matched) or "not measured"
        log(f"  {quote['case']}: ours then {quote['ours_then']}, vLLM then {quote['vllm_then']} "
            f"({quote['cells']}); ours now: {now}")
    log("")
    log(f"the kernels' grid; floor = max(bytes moved once / {bandwidth / 1e12:.2f} TB/s copy, "
        f"FLOPs / {rate / 1e12:.0f} TFLOP/s bf16 mm); x floor = ours / floor (* = the FLOP floor)")
    summary_table(rows)
    for family in (MLA_DECODE, DECODE):
        if any(r["family"] == family for r in rows):  # (--families may leave it out)
            log("")
            decode_table(rows, family, g)
    log("")
    kernel_split_table(rows)
    log("")
    prefill_table(rows, g)
    if any(r["family"] == MLA_MHA_PREFILL and r.get("kernel_us") for r in rows):
        log("")
        mla_attention_table(rows)
    for key in SWEEPS:
        if any(r.get("sweep_name") == key for r in rows):
            log("")
            config_sweep_table([r for r in rows if r.get("sweep_name") == key], key)


def config_sweep_table(swept, key):
    """--config-sweep: each config's x floor on every swept cell of one kernel, the best worst case first (a config
    that failed, or whose output differs from the default's, counts as infinitely slow)."""
    title, default, _ = SWEEPS[key]
    fields = list(default)
    by_cfg = {}
    for r in swept:
        for v in r["sweep"]:
            by_cfg.setdefault(tuple(v[k] for k in fields), {})[r["name"]] = v

    def x(v):
        return v["x_floor"] if "x_floor" in v and v["rel_err_vs_default"] < BF16_BOUND else math.inf

    def worst(cells):
        return max(x(cells.get(r["name"], {})) for r in swept)

    def shown(value, width):
        return f"{value:{width}.2f}" if value != math.inf else f"{'err':>{width}s}"

    log(f"{title} configs (default {default}), x floor per cell, best worst case first; "
        "err: failed or differs from the default's output")
    log(" ".join(f"{k[:8]:>8s}" for k in fields) + "".join(f"{r['name'][:20]:>22s}" for r in swept) + f"{'worst':>8s}")
    for values, cells in sorted(by_cfg.items(), key=lambda kv: worst(kv[1])):
        log(" ".join(f"{str(v):>8s}" for v in values) + "".join(shown(x(cells.get(r["name"], {})), 22) for r in swept)
            + shown(worst(cells), 8))


def dry_run_shapes():
    global DECODE_SHAPES, MLA_SHAPE, DECODE_SWEEP, MLA_SWEEP, HEAD_DIM, SWEEPS
    kb.DEVICE, HEAD_DIM = "cpu", 32
    DECODE_SHAPES = [(n, 2, 40, hq // 4, hkv // 4 if hkv > 4 else 1, mixed)
                     for n, _, _, hq, hkv, mixed in DECODE_SHAPES]
    MLA_SHAPE = (MLA_SHAPE[0], 2, 40, 16, 64, 16)
    DECODE_SWEEP, MLA_SWEEP = DECODE_SWEEP[:1], MLA_SWEEP[:1]
    SWEEPS = {key: (title, default, configs[:1] + configs[-1:]) for key, (title, default, configs) in SWEEPS.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time configs and partition sizes")
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"), help="folder for JSON and log")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--grid", action="store_true", help="the kernels' grid: every kernel on every shape")
    parser.add_argument("--config-sweep", nargs="*", choices=sorted(SWEEPS), metavar="SWEEP",
                        help="--grid also times kernel configs on the cells sweep_of() picks: the SWEEPS named "
                             f"({', '.join(SWEEPS)}), every one if none is")
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILY_KEYS), metavar="FAMILY",
                        help=f"--grid runs only these kernel families ({', '.join(FAMILY_KEYS)})")
    parser.add_argument("--decode-maxnreg", type=int, metavar="N",
                        help="dense decode's register cap (memcheck/kernels/decode.py DEFAULT_CONFIG maxnreg; default none: "
                             "ptxas's 125-126, 4 programs a multiprocessor)")
    parser.add_argument("--combine-programs-per-sm", type=int, metavar="N",
                        help="decode's combine splits its blocks until it has N programs a multiprocessor (default "
                             f"{work_split.COMBINE_PROGRAMS_PER_SM}: memcheck/kernels/work_split.py)")
    parser.add_argument("--flush", choices=("write", "read"), default=kb.FLUSH,
                        help=f"how L2 is emptied before each timed replay (FLUSH; default {kb.FLUSH})")
    parser.add_argument("--max-seconds", type=float, default=480,
                        help="--grid starts no cell past this many seconds from the start (default 480)")
    args = parser.parse_args()
    if args.grid and args.sweep:
        parser.error("--sweep times the default shapes' configs: run it without --grid")
    if args.config_sweep == []:
        args.config_sweep = list(SWEEPS)
    if args.config_sweep and not args.grid:
        parser.error("--config-sweep times configs on the grid's cells: run it with --grid")
    if args.families and not args.grid:
        parser.error("--families picks the grid's cells: run it with --grid")
    if not args.dry_run:
        require_gpu("kernels_h200.py", has_dry_run=True)
    os.makedirs(args.out, exist_ok=True)
    kb.FLUSH = args.flush
    if args.decode_maxnreg is not None:
        decode.DEFAULT_CONFIG["maxnreg"] = args.decode_maxnreg
    if args.combine_programs_per_sm is not None:
        work_split.COMBINE_PROGRAMS_PER_SM = args.combine_programs_per_sm
    t0 = time.time()
    if args.dry_run:
        dry_run_shapes()
        name, sms = "cpu (dry run)", 4
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
    env = {"date": datetime.date.today().isoformat(), "device": name, "sms": sms,
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "defaults": {"decode": decode.DEFAULT_CONFIG, "mla": mla.DEFAULT_CONFIG,
                        "mla_few_heads_hopper": mla.FEW_HEADS_HOPPER_CONFIG,
                        "mla_mid_heads": mla.MID_HEADS_CONFIG, "mla_many_heads": mla.MANY_HEADS_CONFIG,
                        "mla_prefill": mla.PREFILL_CONFIG, "mla_mha_prefill": mla_mha.CONFIG,
                        "prefill": prefill.CONFIG, "combine_programs_per_sm": work_split.COMBINE_PROGRAMS_PER_SM}, "flush": kb.FLUSH}
    log("env", json.dumps(env))
    torch.manual_seed(0)
    if args.grid:
        return run_grid(args, DRY_GRID if args.dry_run else GRID, env, t0)
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write, 4 GiB device-to-device copy)")
    gen = torch.Generator().manual_seed(0)
    checks = check_prefill_and_write(gen)
    rows = []
    for shape in DECODE_SHAPES:
        log(f"== {shape[0]}")
        rows.append(run_decode(shape, bw, args.sweep, gen))
        log(json.dumps({k: v for k, v in rows[-1].items() if not k.startswith("sweep")}))
    log(f"== {MLA_SHAPE[0]}")
    rows.append(run_mla(bw, args.sweep, gen))
    log(json.dumps({k: v for k, v in rows[-1].items() if not k.startswith("sweep")}))

    result = {"env": env, "copy_bandwidth_Bps": bw, "rows": rows, "prefill_and_write": checks,
              "seconds": time.time() - t0}
    with open(os.path.join(args.out, "kernels_h200.json"), "w") as f:
        json.dump(result, f, indent=1)

    log("")
    log(f"paged decode, bf16, block {BLOCK}, scattered blocks; floor = KV bytes / {bw / 1e12:.2f} TB/s copy bandwidth")
    log(f"{'shape':30s} {'ok':>3s} {'rel_err':>8s} {'floor ms':>9s} {'ours ms':>8s} {'x floor':>8s} "
        f"{'graph ms':>9s} {'SDPA ms':>8s} {'vLLM x':>7s} {'grid':>5s}")
    for r in rows:
        sdpa = f"{r['sdpa_ms']:.4f}" if "sdpa_ms" in r else "n/a"
        vllm = f"{VLLM[r['shape']]:.2f}" if r["shape"] in VLLM else "n/a"
        log(f"{r['shape']:30s} {'yes' if r['ok'] else 'NO':>3s} {r['rel_err']:8.1e} {r['floor_ms']:9.4f} "
            f"{r['ms']:8.4f} {r['x_floor']:8.3f} {r['ms_graph']:9.4f} {sdpa:>8s} {vllm:>7s} {r['programs']:5d}")
    log(f"chunked prefill + write_kv: {'ok' if checks['ok'] else 'FAILED'} (prefill rel_err "
        f"{checks['prefill_rel_err']:.1e}, write exact {checks['write_kv_exact']})")
    log(f"total {time.time() - t0:.0f} s")
    with open(os.path.join(args.out, "kernels_h200.log"), "w") as f:
        f.write("\n".join(kb.LOG) + "\n")


if __name__ == "__main__":
    main()
