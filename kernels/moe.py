"""The routed experts of a mixture-of-experts layer, in Triton: two launches for the whole layer,
whatever the number of experts, and no host sync (so the layer can live in a CUDA graph).

Picks (token, k-th choice) are sorted by expert on the device; expert e's picks are rows
offsets[e]:offsets[e+1] of the sorted order. The grid is (experts, column tiles) and fixed: a program
whose expert got no picks returns at once, so the weights of untouched experts are never read.
  1. gate-up: h[pick] = silu(x[token] @ W_gate[e]^T) * (x[token] @ W_up[e]^T), both halves in one
     program (the activation never leaves registers in float32)
  2. down: y[pick] = routing_weight[pick] * (h[pick] @ W_down[e]^T), float32, at the pick's own row
  3. sum: out[token] = sum of its top_k rows of y (in a fixed order: deterministic), rounded to the
     model dtype, plus the shared experts' output (as torch's `out += shared` would round it)
Weight layout is transformers': gate_up [experts, 2 x inter, hidden], down [experts, hidden, inter].
"""
import torch
import triton
import triton.language as tl

from .dispatch import dot_precision, fix_triton_interpreter, next_pow2, upcast_dots
from .dot import dot

fix_triton_interpreter()

# Decode is memory-bound: small row tiles (16 = the tensor cores' least), wide weight tiles.
# Prefill (many picks per expert) takes taller row tiles so each weight tile is read fewer times.
DEFAULT_CONFIG = {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3}
CPU_TILES = {"block_n": 16, "block_k": 16}  # the interpreter runs small tiles faster
TALL_ROWS = 64
TALL_PICKS_PER_EXPERT = 32  # mean picks per expert from which the taller row tile pays
ONE_PROGRAM_SORT_PICKS = 4096  # up to this many picks (256 decode rows x top 8 and more) one program sorts them


@triton.jit
def _expert_tile(offsets_ptr, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's expert, its picks' rows [start, end) in the sorted order, and its output columns."""
    e = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return e, tl.load(offsets_ptr + e), tl.load(offsets_ptr + e + 1), cols, cols < WIDTH


@triton.jit
def _gate_up(x_ptr, w_ptr, h_ptr, order_ptr, offsets_ptr,
             stride_x, stride_we, stride_wn, stride_h,
             HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    e, start, end, cols, col_mask = _expert_tile(offsets_ptr, INTER, BLOCK_N)
    w_gate = w_ptr + e.to(tl.int64) * stride_we + cols[None, :] * stride_wn
    w_up = w_gate + INTER * stride_wn
    for m0 in range(start, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_mask = rows < end
        token = tl.load(order_ptr + rows, mask=row_mask, other=0) // TOP_K
        x_rows = x_ptr + token.to(tl.int64)[:, None] * stride_x
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_mask = ks < HIDDEN
            x = tl.load(x_rows + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            w_mask = k_mask[:, None] & col_mask[None, :]
            gate += dot(x, tl.load(w_gate + ks[:, None], mask=w_mask, other=0.0), DOT_PRECISION, UPCAST)
            up += dot(x, tl.load(w_up + ks[:, None], mask=w_mask, other=0.0), DOT_PRECISION, UPCAST)
        h = gate * tl.sigmoid(gate) * up
        tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_h + cols[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _down(h_ptr, w_ptr, y_ptr, order_ptr, offsets_ptr, weight_ptr,
          stride_h, stride_we, stride_wn, stride_y,
          HIDDEN: tl.constexpr, INTER: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    e, start, end, cols, col_mask = _expert_tile(offsets_ptr, HIDDEN, BLOCK_N)
    w_rows = w_ptr + e.to(tl.int64) * stride_we + cols[None, :] * stride_wn
    for m0 in range(start, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_mask = rows < end
        h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_h
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_mask = ks < INTER
            h = tl.load(h_rows + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_rows + ks[:, None], mask=k_mask[:, None] & col_mask[None, :], other=0.0)
            acc += dot(h, w, DOT_PRECISION, UPCAST)
        pick = tl.load(order_ptr + rows, mask=row_mask, other=0)
        acc *= tl.load(weight_ptr + pick, mask=row_mask, other=0.0)[:, None]
        tl.store(y_ptr + pick.to(tl.int64)[:, None] * stride_y + cols[None, :], acc,
                 mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _sum_picks(y_ptr, shared_ptr, out_ptr, stride_shared, stride_out,
               HIDDEN: tl.constexpr, TOP_K: tl.constexpr, BLOCK: tl.constexpr, HAS_SHARED: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    acc = tl.zeros([BLOCK], tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + k) * HIDDEN + cols, mask=mask, other=0.0)
    out = acc.to(out_ptr.dtype.element_ty)
    if HAS_SHARED:
        out = (out.to(tl.float32) + tl.load(shared_ptr + t * stride_shared + cols, mask=mask, other=0.0).to(tl.float32))
        out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_out + cols, out, mask=mask)


@triton.jit
def _sort_picks(ids_ptr, order_ptr, offsets_ptr, num_picks,
                NUM_EXPERTS: tl.constexpr, EXPERTS_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """One program: a counting sort of the picks by expert, stable (a pick's place among its expert's
    picks is its rank in pick order: a running count plus a cumulative sum over the block's one-hot)."""
    experts = tl.arange(0, EXPERTS_PAD)
    counts = tl.zeros([EXPERTS_PAD], tl.int32)
    for p0 in range(0, num_picks, BLOCK):
        picks = p0 + tl.arange(0, BLOCK)
        e = tl.load(ids_ptr + picks, mask=picks < num_picks, other=EXPERTS_PAD).to(tl.int32)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), 0)
    starts = tl.cumsum(counts, 0) - counts
    tl.store(offsets_ptr + experts, starts, mask=experts < NUM_EXPERTS)
    tl.store(offsets_ptr + NUM_EXPERTS, tl.sum(counts, 0))
    placed = tl.zeros([EXPERTS_PAD], tl.int32)  # picks of each expert placed by earlier blocks
    for p0 in range(0, num_picks, BLOCK):
        picks = p0 + tl.arange(0, BLOCK)
        e = tl.load(ids_ptr + picks, mask=picks < num_picks, other=EXPERTS_PAD).to(tl.int32)
        hot = (e[:, None] == experts[None, :]).to(tl.int32)
        before = tl.cumsum(hot, 0) - hot + (starts + placed)[None, :]  # [picks, experts]
        tl.store(order_ptr + tl.sum(hot * before, 1), picks, mask=picks < num_picks)
        placed += tl.sum(hot, 0)


def sort_picks(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, top_k] -> (order: flat pick indices sorted by expert, stable; offsets [experts + 1]), on the
    device without a host sync (no bincount: it reads the largest id back to size its output). Decode-sized
    batches in one launch of _sort_picks (torch's radix sort took 9-27 us per MoE layer of a V2-Lite decode
    step on an H200); a prefill's thousands of picks through torch's sort, which spreads over the GPU."""
    flat = ids.reshape(-1)
    if flat.numel() > ONE_PROGRAM_SORT_PICKS:
        sorted_ids, order = flat.sort(stable=True)
        bounds = torch.arange(num_experts + 1, device=ids.device, dtype=sorted_ids.dtype)
        return order, torch.searchsorted(sorted_ids, bounds)
    order = torch.empty(flat.numel(), device=ids.device, dtype=torch.int32)
    offsets = torch.empty(num_experts + 1, device=ids.device, dtype=torch.int32)
    experts_pad = max(16, next_pow2(num_experts))
    _sort_picks[(1,)](flat, order, offsets, flat.numel(), NUM_EXPERTS=num_experts, EXPERTS_PAD=experts_pad,
                      BLOCK=max(16, 16384 // experts_pad), num_warps=4)
    return order, offsets


def fused_moe(x, gate_up, down, weights, ids, shared=None, *, config=None):
    """x [T, hidden]; gate_up [E, 2 x inter, hidden]; down [E, hidden, inter]; weights [T, top_k] float32
    (routing weights, scaling included); ids [T, top_k]; shared [T, hidden] or None. Returns [T, hidden] in
    x's dtype."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    inter, top_k = two_inter // 2, ids.shape[1]
    assert x.stride(-1) == 1 and gate_up.stride(-1) == 1 and down.stride(-1) == 1
    cpu_tiles = {} if x.device.type == "cuda" else CPU_TILES
    cfg = {**DEFAULT_CONFIG, **cpu_tiles, **(config or {})}
    picks = num_tokens * top_k
    block_m = TALL_ROWS if picks >= TALL_PICKS_PER_EXPERT * num_experts else 16
    order, offsets = sort_picks(ids, num_experts)
    weights = weights.reshape(-1).float().contiguous()
    h = torch.empty(picks, inter, device=x.device, dtype=x.dtype)
    y = torch.empty(picks, hidden, device=x.device, dtype=torch.float32)
    common = dict(BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
                  DOT_PRECISION=dot_precision(x.dtype), UPCAST=upcast_dots(x),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    _gate_up[(num_experts, triton.cdiv(inter, cfg["block_n"]))](
        x, gate_up, h, order, offsets, x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0),
        HIDDEN=hidden, INTER=inter, TOP_K=top_k, **common)
    _down[(num_experts, triton.cdiv(hidden, cfg["block_n"]))](
        h, down, y, order, offsets, weights, h.stride(0), down.stride(0), down.stride(1), y.stride(0),
        HIDDEN=hidden, INTER=inter, **common)
    del h
    out = torch.empty_like(x)
    if num_tokens:
        block = min(1024, next_pow2(hidden))
        _sum_picks[(num_tokens, triton.cdiv(hidden, block))](
            y, x if shared is None else shared, out, 0 if shared is None else shared.stride(0), out.stride(0),
            HIDDEN=hidden, TOP_K=top_k, BLOCK=block, HAS_SHARED=shared is not None, num_warps=4)
    return out
