"""What the GPU benchmarks share: the timer (CUDA-graph replays, L2 emptied before each), the paged-attention cells
(a family, a batch, a context, heads) with their floors and their inputs built for the kernels' entry points, and the
error of an output against its float32 reference. benchmarks/kernels_h200.py times the whole grid of cells; the other
scripts time or check a few of them.

DEVICE, FLUSH and TABLES are the run's settings: a script sets them here (bench.FLUSH = "read") before it times.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from memcheck import kernels
from memcheck.kernels import decode, mla, mla_mha, prefill, reference


DEVICE = "cuda"


BLOCK = 16


DTYPE = torch.bfloat16


BF16_BOUND = 1e-2  # ||out - ref|| / ||ref|| for bf16 operands, fp32 accumulation


LAST_ROWS = 256  # the decompressed MLA prefill's cells too big for a whole fp32 reference check their last rows


LOG = []


def log(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)


def require_gpu(script, has_dry_run=False):
    """A device-call script started where torch sees no CUDA GPU: one line naming the script, not a traceback from
    inside torch's first CUDA call. has_dry_run: the script's --dry-run runs on the CPU, and the line says so."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script}: needs a CUDA GPU; torch {torch.__version__} sees none"
                         + (" (--dry-run runs on the CPU)" if has_dry_run else ""))


def bench(fn):
    """Median of do_bench (L2 flushed before every run, warm-up first), in ms."""
    if DEVICE == "cpu":  # --dry-run: one untimed call checks the plumbing
        fn()
        return 1.0
    return do_bench(fn, warmup=25, rep=150, return_mode="median")


# How bench_graph empties L2 before a replay (--flush). "write" zeroes 256 MB, as triton's do_bench does: L2 is left
# full of dirty lines, which the timed kernels' first misses write back to HBM inside the timing (tens of MB: a few us
# on each small layer). "read" sums 256 MB: L2 is left holding clean lines, as a decode step's weight reads leave it.
FLUSH = "write"


def flush_l2():
    """A call that empties L2 of the timed kernels' data, the FLUSH way ("none": left warm, to tell a cold start's
    cost)."""
    if FLUSH == "none":
        return lambda: None
    if FLUSH == "read":
        buffer = torch.empty(64 * 2**20, dtype=torch.float32, device=DEVICE).normal_()
        return lambda: torch.sum(buffer)
    buffer = torch.empty(256 * 2**20, dtype=torch.int8, device=DEVICE)
    return buffer.zero_


def bench_graph(fn, replays=60):
    """Median over CUDA-graph replays (no host launch gaps), L2 flushed before each (FLUSH), in ms; the first
    sixth of the replays are warm-up."""
    if DEVICE == "cpu":
        return bench(fn)
    times = replay_times(graph_of(fn), flush_l2(), replays)
    kept = sorted(times[replays // 6:])
    return kept[len(kept) // 2]


def graph_of(fn):
    """fn captured in a CUDA graph (run once before, for compiles)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.synchronize()
    return graph


def replay_times(graph, flush, replays):
    """Each replay of a captured CUDA graph, `flush` called before it, in ms."""
    times = []
    for _ in range(replays):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


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


# Where a cell's cache blocks lie: "scattered", every block of every sequence at a random place (a long-running
# server's cache, and the default), or "contiguous", each sequence's blocks in order (address translation at its best).
TABLES = "scattered"


def scattered_tables(lengths, gen, block_size=BLOCK):
    """Block tables over a cache with every block of every sequence at a random place (TABLES)."""
    blocks_per_seq = [math.ceil(n / block_size) for n in lengths]
    width = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 8
    perm = torch.randperm(num_blocks, generator=gen) if TABLES == "scattered" else torch.arange(num_blocks)
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


# --grid: the kernels' range, every paged-attention kernel on every shape in one device call, through the entry points
# the paged stack calls (memcheck/stacks/paged/attention.py and mla.py), in the stack's layouts.
MLA_DECODE, DECODE, PREFILL, MLA_PREFILL = "MLA decode", "paged decode", "prefill", "MLA prefill"


# MLA prefill: the stack's is the decompressed form; the absorbed runs a step where it costs fewer FLOPs (few new
# tokens on a long prefix: memcheck/stacks/paged/mla.py's runs_decompressed)
MLA_MHA_PREFILL = "MLA prefill, decompressed"


FAMILIES = (MLA_DECODE, DECODE, PREFILL, MLA_PREFILL, MLA_MHA_PREFILL)


FAMILY_KEYS = {"mla-decode": MLA_DECODE, "decode": DECODE, "prefill": PREFILL, "mla-prefill": MLA_PREFILL,
               "mla-mha-prefill": MLA_MHA_PREFILL}  # --families


PREFILLS, MLA_FAMILIES = (PREFILL, MLA_PREFILL, MLA_MHA_PREFILL), (MLA_DECODE, MLA_PREFILL, MLA_MHA_PREFILL)


SDPA = "SDPA beside"  # torch SDPA on a contiguous cache, timed beside each prefill cell


# the decompressed MLA prefill's attention: the Gluon kernel on sm_90, Triton's elsewhere (mla_attention_table)
ATTENTION_KERNELS = ("_prefill_hopper", "_mha_prefill")


GRID = {
    "batches": (1, 8, 32, 128, 256), "contexts": (1024, 4096, 32768, 131072),
    "mla_heads": (16, 128), "rank": 512, "rope": 64,  # DeepSeek-V2-Lite; V2/V3
    "dense": ((28, 4), (32, 8), (32, 32)), "head_dim": 128,  # R1-Distill-Qwen-7B's GQA 28/4 first
    "long_mla": 65536,  # the quoted "MLA, one sequence of 64K" row
    "swept_mla_batches": (8, 32, 256),  # --config-sweep's MLA decode cells (1K and 4K)
    # --config-sweep's dense decode cells: over 1.10x of the floor when chosen, floors of 15-500 us, 4 batch sizes
    "swept_decode_cells": ("GQA 28/4 b32 x 1K", "GQA 28/4 b8 x 4K", "GQA 28/4 b1 x 32K", "GQA 28/4 b256 x 4K",
                           "GQA 28/4 b128 x 1K", "GQA 32/8 b1 x 128K"),
    "profiled_batch": 32,  # decode cells up to this batch also get each kernel's time (torch.profiler)
    "prompts": (2048, 8192, 32768), "many": (8, 2048), "chunk": (2048, 30720),  # chunk: (new, cached prefix)
    "mla_prefill": (16, 4096, 192, 128),  # heads, prompt, the q/k and v widths of its FLOP floor (V2-Lite)
    # heads, prompt (widths as mla_prefill's); 128 heads x 32K decompresses 2 GiB: windows of 16,101 tokens, three
    "mla_mha_prefill": ((16, 4096), (16, 32768), (128, 4096), (128, 32768)),
    "cap_bytes": 60e9,  # cells whose cache would pass this are skipped (and listed)
    "cold_bytes": 160e6, "max_layers": 64,  # a small cache is timed as layers' caches of this many bytes (> L2)
}


DRY_GRID = {  # --grid --dry-run: every family's code path on the CPU, one MHA cell over the cap, two layers
    "batches": (1, 2), "contexts": (32, 64), "mla_heads": (16, 40), "rank": 64, "rope": 16,
    "dense": ((7, 1), (8, 2), (4, 4)), "head_dim": 32, "long_mla": 96, "swept_mla_batches": (2,), "profiled_batch": 1,
    "swept_decode_cells": ("GQA 7/1 b2 x 64",),
    "prompts": (32, 64, 96), "many": (3, 32), "chunk": (16, 48), "mla_prefill": (16, 64, 48, 32),
    "mla_mha_prefill": ((16, 64), (32, 96)),
    "cap_bytes": 40_000, "cold_bytes": 40_000, "max_layers": 2,
}


# The H200's rates (copy 4.28 TB/s; about 790 TFLOP/s for bf16 torch.mm) and what a cell costs there, for the
# estimate --grid prints before it starts: ours and SDPA at a few times the floor (decode 1.1x batched, MLA 1.8x to
# 27x, prefill 3-7x, SDPA 1.3-1.6x), a decode launch pair (decode + merge) about 12 us however small, a replay's L2
# flush and sync.
H200_COPY_BPS, H200_MM_FLOPS = 4.28e12, 7.9e14


def tokens(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


@dataclass(frozen=True)
class Cell:
    """One measurement: `batch` sequences of `context` tokens in the paged cache, the last `new` of each the
    queries (1: decode)."""
    family: str
    batch: int
    context: int
    new: int
    q_heads: int
    kv_heads: int  # MLA: 1, the latent row every head reads
    head_dim: int  # MLA: kv_lora_rank
    rope: int = 0  # MLA: qk_rope_head_dim
    floor_dims: tuple = ()  # (q/k, v) widths of the FLOP floor where the kernel's own math is wider (MLA prefill)
    check: bool = False  # compared with memcheck/kernels/reference.py in float32
    block_size: int = BLOCK  # tokens a cache block

    @property
    def shape(self):
        if self.family in MLA_FAMILIES:
            return f"MLA {self.q_heads}h"
        return f"{'MHA' if self.q_heads == self.kv_heads else 'GQA'} {self.q_heads}/{self.kv_heads}"

    @property
    def case(self):
        if self.new == 1:
            return f"b{self.batch} x {tokens(self.context)}"
        if self.new == self.context:
            return f"{self.batch} x {tokens(self.context)} causal"
        return f"{self.batch} x {tokens(self.new)} new on {tokens(self.context - self.new)} cached"

    @property
    def name(self):
        blocks = f", blocks of {self.block_size}" if self.block_size != BLOCK else ""
        return f"{self.shape} {self.case}{blocks}"


def cache_bytes(c):
    row = (c.head_dim + c.rope) if c.family in MLA_FAMILIES else 2 * c.kv_heads * c.head_dim
    return c.batch * c.context * row * DTYPE.itemsize


def traffic_bytes(c):
    """Bytes that must move at least once: the cache and the queries read, the output written."""
    return cache_bytes(c) + c.batch * c.new * c.q_heads * (c.head_dim + c.rope + c.head_dim) * DTYPE.itemsize


def attention_flops(c):
    """2 x (q/k + v width) per (query head, key it sees): queries see the cached prefix and, causally, each other."""
    qk, v = c.floor_dims or (c.head_dim + c.rope, c.head_dim)
    pairs = c.batch * (c.new * (c.context - c.new) + c.new * (c.new + 1) // 2)
    return 2 * pairs * c.q_heads * (qk + v)


def floor_ms(moved, flops, bandwidth, rate):
    """The least time: every byte moved once at the copy bandwidth, or every FLOP at the matmul rate."""
    return max(moved / bandwidth, flops / rate) * 1e3


def cell_layers(c, g):
    """Decode caches under cold_bytes are timed as several layers' caches, one call each (a decode step's
    pattern): each read from HBM, as in the engine, and the launches amortised as in its CUDA graph."""
    if c.family in PREFILLS:
        return 1
    return min(g["max_layers"], max(1, math.ceil(g["cold_bytes"] / cache_bytes(c))))


def replays_for(ms):
    return 60 if ms < 2 else 20


def all_cells(g):
    """Every cell of the grid `g`, shape by shape, context by context."""
    batches, contexts = g["batches"], g["contexts"]
    checked = (batches[1], contexts[1])
    cells = []
    for heads in g["mla_heads"]:
        sizes = [(b, n) for n in contexts for b in batches]
        long_one = (1, g["long_mla"])
        sizes += [long_one] if heads == g["mla_heads"][0] else []
        cells += [Cell(MLA_DECODE, b, n, 1, heads, 1, g["rank"], g["rope"], check=(b, n) in (checked, long_one))
                  for b, n in sizes]
    for i, (hq, hkv) in enumerate(g["dense"]):
        long_one = (1, contexts[-1]) if i == 0 else None
        cells += [Cell(DECODE, b, n, 1, hq, hkv, g["head_dim"], check=(b, n) in (checked, long_one))
                  for n in contexts for b in batches]
    hq, hkv = g["dense"][0]
    many, prompt = g["many"]
    new, prefix = g["chunk"]
    prefills = [(1, n, n) for n in g["prompts"]] + [(many, prompt, prompt), (1, prefix + new, new)]
    cells += [Cell(PREFILL, b, n, q, hq, hkv, g["head_dim"], check=b > 1 or q < n) for b, n, q in prefills]
    heads, prompt, qk, v = g["mla_prefill"]
    cells.append(Cell(MLA_PREFILL, 1, prompt, prompt, heads, 1, g["rank"], g["rope"], (qk, v), check=True))
    cells += [Cell(MLA_MHA_PREFILL, 1, prompt, prompt, heads, 1, g["rank"], g["rope"], (qk, v),
                   check=(heads, prompt) == g["mla_mha_prefill"][0]) for heads, prompt in g["mla_mha_prefill"]]
    return cells


def matmul_rate():
    """bf16 FLOP/s of torch.mm at 8192^3, the best of do_bench's runs."""
    n = 8192 if DEVICE == "cuda" else 256
    a, b = (torch.randn(n, n, device=DEVICE, dtype=DTYPE) for _ in range(2))
    if DEVICE == "cpu":  # --dry-run: the plumbing only
        torch.mm(a, b)
        return 2 * n**3 / 1e-3
    ms = do_bench(lambda: torch.mm(a, b), warmup=50, rep=300, return_mode="min")
    return 2 * n**3 / (ms * 1e-3)


def paged_batch(c, gen):
    """Block table (blocks scattered at random), seq_lens and the cache's block count for c's sequences."""
    lengths = [c.context] * c.batch
    table, num_blocks = scattered_tables(lengths, gen, c.block_size)
    return table, torch.tensor(lengths, dtype=torch.int32, device=DEVICE), num_blocks


def bf16(*shape):
    return torch.randn(*shape, device=DEVICE, dtype=DTYPE)


def decode_cell(c, layers, gen):
    table, seq_lens, num_blocks = paged_batch(c, gen)
    shape = (num_blocks, c.block_size, c.kv_heads, c.head_dim)
    caches = [(bf16(*shape), bf16(*shape)) for _ in range(layers)]
    q, scale = bf16(c.batch, c.q_heads, c.head_dim), c.head_dim ** -0.5
    k0, v0 = caches[0]
    return {"step": lambda: [kernels.paged_decode(q, k, v, table, seq_lens, scale) for k, v in caches],
            "with_config": lambda cfg: lambda: [decode.paged_decode(q, k, v, table, seq_lens, scale, config=cfg)
                                                for k, v in caches],
            "output_with": lambda cfg: decode.paged_decode(q, k0, v0, table, seq_lens, scale, config=cfg),
            "output": lambda: kernels.paged_decode(q, k0, v0, table, seq_lens, scale),
            "reference": lambda: reference.paged_decode(q.float(), k0.float(), v0.float(), table, seq_lens, scale)}


def mla_queries(c):
    """q_latent in the layout of the stack's bmm ([heads, tokens, rank] transposed), q_pe, an output like it."""
    q_lat = bf16(c.q_heads, c.batch * c.new, c.head_dim).transpose(0, 1)
    return q_lat, bf16(c.batch * c.new, c.q_heads, c.rope), torch.empty_like(q_lat)


def mla_decode_cell(c, layers, gen):
    table, seq_lens, num_blocks = paged_batch(c, gen)
    caches = [bf16(num_blocks, c.block_size, c.head_dim + c.rope) for _ in range(layers)]
    (q_lat, q_pe, out), scale = mla_queries(c), (128 + 64) ** -0.5

    def step_with(cfg):
        return lambda: [mla.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, out=out, config=cfg)
                        for cache in caches]

    return {"step": lambda: [kernels.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, out=out)
                             for cache in caches],
            "with_config": step_with,
            "output_with": lambda cfg: mla.mla_decode(q_lat, q_pe, caches[0], table, seq_lens, scale,
                                                      out=poisoned(out), config=cfg),
            "output": lambda: kernels.mla_decode(q_lat, q_pe, caches[0], table, seq_lens, scale, out=poisoned(out)),
            "reference": lambda: reference.mla_decode(q_lat.float(), q_pe.float(), caches[0].float(), table,
                                                      seq_lens, scale)}


def packed_starts(c):
    return (torch.arange(c.batch + 1, dtype=torch.int32) * c.new).to(DEVICE)


def prefill_cell(c, layers, gen):
    table, seq_lens, num_blocks = paged_batch(c, gen)
    k, v = (bf16(num_blocks, c.block_size, c.kv_heads, c.head_dim) for _ in range(2))
    q, cu, scale = bf16(c.batch * c.new, c.q_heads, c.head_dim), packed_starts(c), c.head_dim ** -0.5
    ours = lambda: kernels.paged_prefill(q, k, v, table, cu, seq_lens, scale, max_q_len=c.new)  # noqa: E731
    kc, vc = contiguous(k, table, c.context), contiguous(v, table, c.context)  # [batch, kv heads, context, dim]
    q4 = q.view(c.batch, c.new, c.q_heads, c.head_dim).transpose(1, 2).contiguous()
    return {"step": ours, "output": ours,
            "with_config": lambda cfg: lambda: prefill.paged_prefill(q, k, v, table, cu, seq_lens, scale,
                                                                     max_q_len=c.new, config=cfg),
            "output_with": lambda cfg: prefill.paged_prefill(q, k, v, table, cu, seq_lens, scale, max_q_len=c.new,
                                                             config=cfg),
            "reference": lambda: reference.paged_prefill(q.float(), k.float(), v.float(), table, cu, seq_lens, scale),
            "sdpa": lambda: causal_sdpa(q4, kc, vc, scale),
            "sdpa_as_ours": lambda o: o.transpose(1, 2).reshape(q.shape)}


def mla_prefill_cell(c, layers, gen):
    """Ours in latent space (absorbed, as the stack runs a step where that costs fewer FLOPs); SDPA on the same-size
    problem decompressed (per-head q/k and v of floor_dims' widths), which the FLOP floor counts."""
    table, seq_lens, num_blocks = paged_batch(c, gen)
    cache = bf16(num_blocks, c.block_size, c.head_dim + c.rope)
    (q_lat, q_pe, out), cu, scale = mla_queries(c), packed_starts(c), (128 + 64) ** -0.5
    qk, v = c.floor_dims
    q4, k4, v4 = bf16(c.batch, c.q_heads, c.new, qk), bf16(c.batch, c.q_heads, c.context, qk), bf16(
        c.batch, c.q_heads, c.context, v)
    return {"step": lambda: kernels.mla_prefill(q_lat, q_pe, cache, table, cu, seq_lens, scale, c.new, out=out),
            "with_config": lambda cfg: lambda: mla.mla_prefill(q_lat, q_pe, cache, table, cu, seq_lens, scale, c.new,
                                                               out=out, config=cfg),
            "output_with": lambda cfg: mla.mla_prefill(q_lat, q_pe, cache, table, cu, seq_lens, scale, c.new,
                                                       out=poisoned(out), config=cfg),
            "output": lambda: kernels.mla_prefill(q_lat, q_pe, cache, table, cu, seq_lens, scale, c.new,
                                                  out=poisoned(out)),
            "reference": lambda: reference.mla_prefill(q_lat.float(), q_pe.float(), cache.float(), table, cu,
                                                       seq_lens, scale),
            "sdpa": lambda: causal_sdpa(q4, k4, v4, scale)}


def mla_mha_prefill_cell(c, layers, gen):
    """kernels.mla_mha_prefill timed whole: the context's latent gathered, decompressed by kv_b_proj (random, scaled
    to keep keys and values near unit size) and attended; SDPA as beside the absorbed cell."""
    table, seq_lens, num_blocks = paged_batch(c, gen)
    cache = bf16(num_blocks, c.block_size, c.head_dim + c.rope)
    qk, v = c.floor_dims
    nope, cu, scale = qk - c.rope, packed_starts(c), qk ** -0.5
    q_nope, q_pe = bf16(c.batch * c.new, c.q_heads, nope), bf16(c.batch * c.new, c.q_heads, c.rope)
    kv_b = bf16(c.q_heads * (nope + v), c.head_dim) * c.head_dim ** -0.5
    out = q_nope.new_empty(c.batch * c.new, c.q_heads, v)
    q4, k4, v4 = bf16(c.batch, c.q_heads, c.new, qk), bf16(c.batch, c.q_heads, c.context, qk), bf16(
        c.batch, c.q_heads, c.context, v)

    def run(cfg=None, into=out):
        return mla_mha.mla_mha_prefill(q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale, c.new,
                                       c.batch * c.context, out=into, config=cfg)

    def reference_last_rows():
        """The last sequence's last LAST_ROWS queries, which see its whole context: (how many, their fp32 output)."""
        n = min(LAST_ROWS, c.new)
        return n, reference.mla_mha_prefill(q_nope[-n:].float(), q_pe[-n:].float(), cache.float(), table[-1:],
                                            torch.tensor([0, n], dtype=torch.int32, device=DEVICE), seq_lens[-1:],
                                            kv_b.float(), scale)

    return {"step": lambda: kernels.mla_mha_prefill(q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale, c.new,
                                                    c.batch * c.context, out=out),
            "reference_last_rows": reference_last_rows,
            "with_config": lambda cfg: lambda: run(cfg),
            "output_with": lambda cfg: run(cfg, poisoned(out)),
            "output": lambda: run(None, poisoned(out)),
            "reference": lambda: reference.mla_mha_prefill(q_nope.float(), q_pe.float(), cache.float(), table, cu,
                                                           seq_lens, kv_b.float(), scale),
            "sdpa": lambda: causal_sdpa(q4, k4, v4, scale)}


BUILDERS = {DECODE: decode_cell, MLA_DECODE: mla_decode_cell, PREFILL: prefill_cell, MLA_PREFILL: mla_prefill_cell,
            MLA_MHA_PREFILL: mla_mha_prefill_cell}


def causal_sdpa(q, k, v, scale):
    """torch SDPA, queries the last keys' positions: causal, lower-right aligned where a prefix is cached."""
    from torch.nn.attention.bias import causal_lower_right

    lq, lk = q.shape[-2], k.shape[-2]
    mask = {"is_causal": True} if lq == lk else {"attn_mask": causal_lower_right(lq, lk)}
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=q.shape[1] != k.shape[1], **mask)


def time_sdpa(sdpa, floor, replays):
    """SDPA beside ours: its flash backend where that takes the shape, else the backend torch picks (and why)."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out, fn, backend = flash(), flash, "flash"
        except RuntimeError as e:  # torch's warnings say why: keep them, less the "(Triggered internally at ...)"
            why = [str(w.message).split(" (Triggered")[0] for w in caught] + [str(e)]
            why = [w for w in why if not w.endswith("not used because:")]
            out, fn, backend = sdpa(), sdpa, "default; flash refused: " + " / ".join(why)[:200]
    ms = bench_graph(fn, replays)
    return {"backend": backend, "ms": ms, "x_floor": ms / floor}, out
