"""The linear layers of a decode step, y = x @ W^T + b for a few rows x (one per sequence) and a weight W [N, K]:
at 1-64 rows the product is a read of W, and its time is how fast the GPU streams W. cuBLAS picks its tiles for
square products; on an H200 its 8-row products of the decode step read 2-15 MB weights at well under the copy
rate.

Grid: (column blocks of BLOCK_N, SPLIT slices of K). A program multiplies the rows by its [BLOCK_N, K / SPLIT]
slice of W with fp32 accumulation. With SPLIT > 1, each program of a column block writes its float32 partial
and takes a ticket; the last one adds the partials, adds the bias and writes y, and resets the ticket for the
next call (CUDA graph replays included): one launch, the sum in float32 and one rounding, as cuBLAS.

Tiles per (GPU, rows bucket, N, K) come from a table measured on that GPU (`benchmarks/paged_h200.py`,
section `skinny_gemm`; `use_tiles` installs one); a product with no measured tile runs cuBLAS, and so does a
launch outside a CUDA graph capture (the decode steps replay graphs; an eager step's Triton launches would cost
more host time than cuBLAS's). Under the CPU interpreter a fixed small tile runs, for the tests."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .dispatch import dot_precision, fix_triton_interpreter, upcast_dots
from .dot import dot
from .tickets import counters

fix_triton_interpreter()

MAX_ROWS = 64  # above, a prefill: cuBLAS's tiles are the right ones
TABLE_FILE = Path(__file__).with_name("skinny_gemm_tiles.json")  # measured tiles, per GPU name


class Tiles(NamedTuple):
    block_n: int
    block_k: int
    split: int
    warps: int
    stages: int


INTERPRETER_TILES = Tiles(block_n=16, block_k=32, split=2, warps=4, stages=1)


@triton.jit
def _store_rows(total, bias_ptr, cols, col_ok, out, done, HAS_BIAS: tl.constexpr):
    """y's tile: the float32 sum plus the bias, rounded once to y's dtype."""
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out, total.to(out.dtype.element_ty), mask=done)


@triton.jit
def _linear(x_ptr, w_ptr, bias_ptr, y_ptr, part_ptr, ticket_ptr, M, N, K, k_per_split, stride_x, stride_w,
            stride_y, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    col_block, k_slice = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_w
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    start = k_slice * k_per_split
    end = tl.minimum(start + k_per_split, K)
    for k in range(start, end, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        if EVEN_K:  # (K, hence every slice, is whole tiles: no column mask on the weight's stream)
            x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None], other=0.0)
        else:
            k_ok = ks < end
            x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += dot(x, tl.trans(w), DOT_PRECISION, UPCAST)
    out = y_ptr + rows.to(tl.int64)[:, None] * stride_y + cols[None, :]
    done = row_ok[:, None] & col_ok[None, :]
    if SPLIT == 1:
        _store_rows(acc, bias_ptr, cols, col_ok, out, done, HAS_BIAS)
    else:
        parts = part_ptr + (rows[:, None] * N + cols[None, :]).to(tl.int64)  # partials [SPLIT, BLOCK_M, N]
        tl.store(parts + k_slice.to(tl.int64) * BLOCK_M * N, acc, mask=col_ok[None, :])
        tl.debug_barrier()  # every thread's partial stored before the ticket releases them
        if tl.atomic_add(ticket_ptr + col_block, 1) == SPLIT - 1:  # acq_rel: the others' partials are visible
            tl.debug_barrier()
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT):
                total += tl.load(parts + s * BLOCK_M * N, mask=col_ok[None, :], other=0.0, cache_modifier=".cg")
            _store_rows(total, bias_ptr, cols, col_ok, out, done, HAS_BIAS)
            tl.store(ticket_ptr + col_block, 0)  # ready for the next call


TICKETS = 1 << 14  # split-K counters per device, at least: one per column block of the product running
_measured: dict[str, dict[str, Tiles]] | None = None  # the table file's tiles (and use_tiles'), per GPU name
_tables: dict[int, dict[str, Tiles]] = {}  # this GPU's, per device index


def rows_bucket(rows: int) -> int:
    """The padded row count the kernel computes (tl.dot tiles are at least 16 rows)."""
    return max(16, 1 << (rows - 1).bit_length())


def table_key(rows: int, n: int, k: int) -> str:
    return f"{rows_bucket(rows)}x{n}x{k}"


def use_tiles(gpu: str, table: dict[str, Tiles]) -> None:
    """Install measured tiles for a GPU (by torch.cuda.get_device_name) in this process, over the file's."""
    _load().setdefault(gpu, {}).update({key: Tiles(*t) for key, t in table.items()})
    _tables.clear()


def _load() -> dict[str, dict[str, Tiles]]:
    global _measured
    if _measured is None:
        raw = json.loads(TABLE_FILE.read_text()) if TABLE_FILE.exists() else {}
        _measured = {gpu: {key: Tiles(**t) for key, t in shapes.items()} for gpu, shapes in raw.get("gpus", {}).items()}
    return _measured


def tiles_for(device: torch.device, rows: int, n: int, k: int) -> Tiles | None:
    """The measured tile of this product on this GPU while a CUDA graph captures it (replayed, the launch costs
    nothing; launched eagerly from Python, a Triton launch takes more host time than cuBLAS's), INTERPRETER_TILES
    on the CPU, None (cuBLAS) otherwise."""
    if not 0 < rows <= MAX_ROWS:
        return None
    if device.type != "cuda":
        return INTERPRETER_TILES
    table = _device_table(device)
    return table.get(table_key(rows, n, k)) if torch.cuda.is_current_stream_capturing() else None


def _device_table(device: torch.device) -> dict[str, Tiles]:
    """This GPU's tiles. The first call on a device also makes its split-K counters: it is an eager step (the
    engine warms up and runs each graph's step eagerly before capturing), and a tensor made during a capture
    would come from the graph's pool."""
    table = _tables.get(device.index)
    if table is None:
        _ticket_counters(device, TICKETS)
        table = _tables[device.index] = _load().get(torch.cuda.get_device_name(device), {})
    return table


def _ticket_counters(device: torch.device, blocks: int) -> torch.Tensor:
    """Zeroed int32 counters, one per column block (memcheck/kernels/tickets.py: each launch leaves them at zero)."""
    return counters(device, blocks, "skinny_gemm")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           tiles: Tiles | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ bias) in x's dtype; cuBLAS (F.linear) where no tile applies."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    rows, n = x2.shape[0], weight.shape[0]
    tiles = tiles or tiles_for(x.device, rows, n, k)
    if tiles is None or x2.stride(-1) != 1 or weight.stride(-1) != 1 or weight.shape[1] != k:
        return F.linear(x, weight, bias)
    block_m = rows_bucket(rows)
    k_per_split = triton.cdiv(triton.cdiv(k, tiles.split), tiles.block_k) * tiles.block_k
    split = triton.cdiv(k, k_per_split)  # (rounding the slices up to whole tiles can leave fewer)
    blocks = triton.cdiv(n, tiles.block_n)
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    parts = torch.empty(split, block_m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    tickets = _ticket_counters(x.device, blocks) if split > 1 else y
    _linear[(blocks, split)](
        x2, weight, bias if bias is not None else y, y, parts, tickets, rows, n, k, k_per_split,
        x2.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, SPLIT=split,
        EVEN_K=k % tiles.block_k == 0, BLOCK_M=block_m,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, DOT_PRECISION=dot_precision(x.dtype),
        UPCAST=upcast_dots(x), num_warps=tiles.warps, num_stages=tiles.stages)
    return y.view(*x.shape[:-1], n)
