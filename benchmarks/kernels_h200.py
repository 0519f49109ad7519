"""Paged-attention kernels on the H200, in one device call: correctness at production sizes
against a float32 reference, then median times against the floor (KV bytes read once / copy
bandwidth measured in this run) and against torch SDPA on a contiguous cache.

    PYTHONUNBUFFERED=1 python benchmarks/kernels_h200.py [--sweep] [--out DIR]
    TRITON_INTERPRET=1 python benchmarks/kernels_h200.py --dry-run   # CPU smoke test of this script

Blocks of 16 tokens scattered at random over the cache, head_dim 128, bf16. --sweep also times
kernel configs and partition sizes around the defaults (the tuning run). Writes
kernels_h200.json and kernels_h200.log to DIR ($OUT on the device machine) and prints a short
table last.
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
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kernels  # noqa: E402
from kernels import decode, dispatch, mla, reference  # noqa: E402

DEVICE = "cuda"
BLOCK = 16
HEAD_DIM = 128
DTYPE = torch.bfloat16
BF16_BOUND = 1e-2  # ||out - ref|| / ||ref|| for bf16 operands, fp32 accumulation

DECODE_SHAPES = [  # name, sequences, context (or "mixed" up to), q heads, kv heads
    ("64x4K GQA 32/8", 64, 4096, 32, 8, False),
    ("16x32K GQA 28/4", 16, 32768, 28, 4, False),
    ("128x2K MHA 32/32", 128, 2048, 32, 32, False),
    ("64x mixed<=8K GQA 32/8", 64, 8192, 32, 8, True),
]
MLA_SHAPE = ("64x4K MLA V2-Lite 16h 512+64", 64, 4096, 16, 512, 64)
VLLM = {"64x4K GQA 32/8": 1.17, "16x32K GQA 28/4": 1.81, "128x2K MHA 32/32": 1.13, "64x mixed<=8K GQA 32/8": 1.71}

# --sweep: configs timed beside the default, each at the one-wave grid (x1) and twice it (x2).
# benchmarks/results/*_tuning.* holds the wider sweep that chose the defaults (and the grid split).
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

LOG = []


def log(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)


def bench(fn):
    """Median of do_bench (L2 flushed before every run, warm-up first), in ms."""
    if DEVICE == "cpu":  # --dry-run: one untimed call checks the plumbing
        fn()
        return 1.0
    return do_bench(fn, warmup=25, rep=150, return_mode="median")


def bench_graph(fn):
    """Median over CUDA-graph replays (no host launch gaps), L2 flushed before each, in ms."""
    if DEVICE == "cpu":
        return bench(fn)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=DEVICE)
    times = []
    for _ in range(60):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[10:])[len(times[10:]) // 2]


def copy_bandwidth():
    """Bytes read + written per second by a 4 GiB device-to-device copy."""
    src = torch.randn(2**30 if DEVICE == "cuda" else 2**20, device=DEVICE, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    bw = 2 * src.numel() * src.element_size() / (ms * 1e-3)
    del src, dst
    return bw


def rel_err(out, ref):
    if torch.isnan(out).any():
        return float("nan")
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def scattered_tables(lengths, gen):
    """Block tables over a cache with every block of every sequence at a random place."""
    blocks_per_seq = [math.ceil(n / BLOCK) for n in lengths]
    width = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 8
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    at = 0
    for i, nb in enumerate(blocks_per_seq):
        table[i, :nb] = perm[at:at + nb].to(torch.int32)
        at += nb
    return table.to(DEVICE), num_blocks


def contiguous(cache, table, length):
    """[S, heads..., L, D] copy of a uniform-length paged cache, for SDPA."""
    s = table.shape[0]
    flat = cache[table.long()].flatten(1, 2)[:, :length]  # [S, L, *row]
    return flat.movedim(1, -2).contiguous() if flat.dim() == 4 else flat.unsqueeze(1).contiguous()


def poisoned(like):
    return torch.full_like(like, float("nan"))


def run_decode(shape, bw, sweep, gen):
    name, num_seqs, ctx, hq, hkv, mixed = shape
    if mixed:
        lengths = torch.randint(1, ctx + 1, (num_seqs,), generator=gen).tolist()
    else:
        lengths = [ctx] * num_seqs
    table, num_blocks = scattered_tables(lengths, gen)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    k_cache = torch.randn(num_blocks, BLOCK, hkv, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    v_cache = torch.randn(num_blocks, BLOCK, hkv, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    q = torch.randn(num_seqs, hq, HEAD_DIM, device=DEVICE, dtype=DTYPE)
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
    if DEVICE == "cuda":
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
    if DEVICE == "cpu":
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
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    cache = torch.randn(num_blocks, BLOCK, rank + rope, device=DEVICE, dtype=DTYPE)
    q_lat = torch.randn(num_seqs, heads, rank, device=DEVICE, dtype=DTYPE)
    q_pe = torch.randn(num_seqs, heads, rope, device=DEVICE, dtype=DTYPE)
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
    prefix = [0, 1000, 3000, 517] if DEVICE == "cuda" else [0, 10, 30, 5]
    new = [2048, 512, 77, 1] if DEVICE == "cuda" else [20, 5, 7, 1]
    lengths = [p + n for p, n in zip(prefix, new)]
    table, num_blocks = scattered_tables(lengths, gen)
    k_cache = torch.full((num_blocks, BLOCK, hkv, d), float("nan"), device=DEVICE, dtype=DTYPE)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_all = torch.randn(sum(lengths), hkv, d, device=DEVICE, dtype=DTYPE)
    v_all = torch.randn_like(k_all)
    slots = torch.cat([(table[i, torch.arange(n, device=DEVICE) // BLOCK].long() * BLOCK
                        + torch.arange(n, device=DEVICE) % BLOCK) for i, n in enumerate(lengths)])
    kernels.write_kv(k_all, v_all, k_cache, v_cache, slots)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    reference.write_kv(k_all, v_all, k_ref, v_ref, slots)
    written = slots.unique()
    flat = lambda c: c.flatten(0, 1)[written]  # noqa: E731
    write_ok = torch.equal(flat(k_cache), flat(k_ref)) and torch.equal(flat(v_cache), flat(v_ref))
    cu = torch.tensor([0] + new, device=DEVICE).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(new), hq, d, device=DEVICE, dtype=DTYPE)
    ref = reference.paged_prefill(q.float(), k_cache.float(), v_cache.float(), table, cu, seq_lens, d ** -0.5)
    out = kernels.paged_prefill(q, k_cache, v_cache, table, cu, seq_lens, d ** -0.5, max_q_len=max(new))
    # MLA: kv_a_proj's fp32 output normalised and rotated into a bf16 latent cache (the norm's sum may round
    # differently from torch's: equal slots, values within bf16 rounding)
    kv_a = torch.randn(sum(new), 576, device=DEVICE)
    norm_w = torch.rand(512, device=DEVICE) + 0.5
    angles = torch.rand(sum(new), 32, device=DEVICE) * 6.3
    latent_cache = torch.full((num_blocks, BLOCK, 576), float("nan"), device=DEVICE, dtype=DTYPE)
    latent_ref = latent_cache.clone()
    new_slots = torch.cat([slots[sum(lengths[:i]) + prefix[i]:sum(lengths[:i + 1])] for i in range(len(new))])
    args = (kv_a, norm_w, 1e-6, angles.cos(), angles.sin(), True)
    kernels.write_latent(*args, latent_cache, new_slots)
    reference.write_latent(*args, latent_ref, new_slots)
    write_ok &= torch.equal(latent_cache.isnan(), latent_ref.isnan()) and torch.allclose(
        latent_cache.float().nan_to_num(7.0), latent_ref.float().nan_to_num(7.0), rtol=1e-2, atol=1e-2)
    row = {"write_kv_exact": write_ok, "prefill_rel_err": rel_err(out, ref)}
    row["ok"] = write_ok and row["prefill_rel_err"] < BF16_BOUND
    if DEVICE == "cuda":
        row["prefill_ms"] = bench(lambda: kernels.paged_prefill(q, k_cache, v_cache, table, cu, seq_lens,
                                                                d ** -0.5, max_q_len=max(new)))
    log("prefill + write_kv", json.dumps(row))
    return row


def dry_run_shapes():
    global DEVICE, DECODE_SHAPES, MLA_SHAPE, DECODE_SWEEP, MLA_SWEEP, HEAD_DIM
    DEVICE, HEAD_DIM = "cpu", 32
    DECODE_SHAPES = [(n, 2, 40, hq // 4, hkv // 4 if hkv > 4 else 1, mixed)
                     for n, _, _, hq, hkv, mixed in DECODE_SHAPES]
    MLA_SHAPE = (MLA_SHAPE[0], 2, 40, 16, 64, 16)
    DECODE_SWEEP, MLA_SWEEP = DECODE_SWEEP[:1], MLA_SWEEP[:1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time configs and partition sizes")
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"), help="folder for JSON and log")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    if args.dry_run:
        dry_run_shapes()
        name, sms = "cpu (dry run)", 4
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
    env = {"date": datetime.date.today().isoformat(), "device": name, "sms": sms,
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "defaults": {"decode": decode.DEFAULT_CONFIG, "mla": mla.DEFAULT_CONFIG}}
    log("env", json.dumps(env))
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
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
