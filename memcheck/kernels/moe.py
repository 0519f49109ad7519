"""The experts of a mixture-of-experts layer, routed and shared, in Triton: four launches for the whole
layer (sort, gate-up, down, sum), whatever the number of experts, and no host sync (so the layer can live
in a CUDA graph).

A pick is (token, k-th choice); the S shared experts are S more picks of every token (experts E..E+S-1,
weight 1), so they run through the same kernels at the same bandwidth instead of three cuBLAS launches.
Picks are sorted by expert on the device; expert e's picks are rows offsets[e]:offsets[e+1] of the sorted
order. The grid is (experts, column tiles) and fixed: a program whose expert got no picks returns at once,
so the weights of untouched experts are never read.
  1. gate-up: h[pick] = silu(x[token] @ W_gate[e]^T) * (x[token] @ W_up[e]^T), both halves in one
     program (the activation never leaves registers in float32)
  2. down: y[pick] = routing_weight[pick] * (h[pick] @ W_down[e]^T), float32, at the pick's own row
  3. sum: out[token] = sum of its top_k + S rows of y (in a fixed order: deterministic), in the model dtype
Weight layout is transformers': routed gate_up [experts, 2 x inter, hidden], down [experts, hidden, inter];
shared (fused gate and up) gate_up [2 x S x inter, hidden] (S gate blocks, then S up blocks), down
[hidden, S x inter].
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
def _pick_expert(ids_ptr, picks, mask, TOP_K: tl.constexpr, SHARED: tl.constexpr, NUM_EXPERTS: tl.constexpr):
    """The expert of each pick: the router's choice, or shared expert NUM_EXPERTS + j for a token's j-th extra pick."""
    k = picks % (TOP_K + SHARED)
    routed = k < TOP_K
    e = tl.load(ids_ptr + (picks // (TOP_K + SHARED)) * TOP_K + k, mask=mask & routed, other=0).to(tl.int32)
    return tl.where(routed, e, NUM_EXPERTS + k - TOP_K)


@triton.jit
def _expert_matrix(e, w_ptr, shared_ptr, stride_we, stride_wn, stride_shared_n, shared_offset,
                   NUM_EXPERTS: tl.constexpr):
    """(base, row stride) of expert e's matrix: routed e's slice of w, or shared expert e - NUM_EXPERTS's block of
    the shared matrix, shared_offset elements apart."""
    routed = e < NUM_EXPERTS
    shared_base = shared_ptr + (e - NUM_EXPERTS).to(tl.int64) * shared_offset
    base = tl.where(routed, w_ptr + e.to(tl.int64) * stride_we, shared_base)
    return base, tl.where(routed, stride_wn, stride_shared_n)


@triton.jit
def _gate_up(x_ptr, w_ptr, shared_ptr, h_ptr, order_ptr, offsets_ptr,
             stride_x, stride_we, stride_wn, stride_shared_n, stride_h,
             HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, SHARED: tl.constexpr,
             NUM_EXPERTS: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    e, start, end, cols, col_mask = _expert_tile(offsets_ptr, INTER, BLOCK_N)
    base, row_stride = _expert_matrix(e, w_ptr, shared_ptr, stride_we, stride_wn, stride_shared_n,
                                      INTER * stride_shared_n, NUM_EXPERTS)
    w_gate = base + cols[None, :] * row_stride
    w_up = w_gate + tl.where(e < NUM_EXPERTS, INTER, SHARED * INTER) * row_stride  # up rows follow the gate rows
    for m0 in range(start, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_mask = rows < end
        token = tl.load(order_ptr + rows, mask=row_mask, other=0) // (TOP_K + SHARED)
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
def _down(h_ptr, w_ptr, shared_ptr, y_ptr, order_ptr, offsets_ptr, weight_ptr,
          stride_h, stride_we, stride_wn, stride_shared_n, stride_y,
          HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, SHARED: tl.constexpr,
          NUM_EXPERTS: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    e, start, end, cols, col_mask = _expert_tile(offsets_ptr, HIDDEN, BLOCK_N)
    base, row_stride = _expert_matrix(e, w_ptr, shared_ptr, stride_we, stride_wn, stride_shared_n, INTER, NUM_EXPERTS)
    w_rows = base + cols[None, :] * row_stride
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
        k = pick % (TOP_K + SHARED)
        weight = tl.load(weight_ptr + (pick // (TOP_K + SHARED)) * TOP_K + k, mask=row_mask & (k < TOP_K), other=1.0)
        acc *= weight[:, None]
        tl.store(y_ptr + pick.to(tl.int64)[:, None] * stride_y + cols[None, :], acc,
                 mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _sum_picks(y_ptr, out_ptr, stride_out, HIDDEN: tl.constexpr, PICKS: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    acc = tl.zeros([BLOCK], tl.float32)
    for k in tl.static_range(PICKS):
        acc += tl.load(y_ptr + (t * PICKS + k) * HIDDEN + cols, mask=mask, other=0.0)
    tl.store(out_ptr + t * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sort_picks(ids_ptr, order_ptr, offsets_ptr, num_picks,
                TOP_K: tl.constexpr, SHARED: tl.constexpr, NUM_EXPERTS: tl.constexpr, EXPERTS_PAD: tl.constexpr,
                BLOCK: tl.constexpr):
    """One program: a counting sort of the picks by expert, stable (a pick's place among its expert's
    picks is its rank in pick order: a running count plus a cumulative sum over the block's one-hot)."""
    experts = tl.arange(0, EXPERTS_PAD)
    counts = tl.zeros([EXPERTS_PAD], tl.int32)
    for p0 in range(0, num_picks, BLOCK):
        picks = p0 + tl.arange(0, BLOCK)
        in_range = picks < num_picks
        e = tl.where(in_range, _pick_expert(ids_ptr, picks, in_range, TOP_K, SHARED, NUM_EXPERTS - SHARED), EXPERTS_PAD)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), 0)
    starts = tl.cumsum(counts, 0) - counts
    tl.store(offsets_ptr + experts, starts, mask=experts < NUM_EXPERTS)
    tl.store(offsets_ptr + NUM_EXPERTS, tl.sum(counts, 0))
    placed = tl.zeros([EXPERTS_PAD], tl.int32)  # picks of each expert placed by earlier blocks
    for p0 in range(0, num_picks, BLOCK):
        picks = p0 + tl.arange(0, BLOCK)
        in_range = picks < num_picks
        e = tl.where(in_range, _pick_expert(ids_ptr, picks, in_range, TOP_K, SHARED, NUM_EXPERTS - SHARED), EXPERTS_PAD)
        hot = (e[:, None] == experts[None, :]).to(tl.int32)
        before = tl.cumsum(hot, 0) - hot + (starts + placed)[None, :]  # [picks, experts]
        tl.store(order_ptr + tl.sum(hot * before, 1), picks, mask=picks < num_picks)
        placed += tl.sum(hot, 0)


def sort_picks(ids: torch.Tensor, num_experts: int, shared: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, top_k] (and `shared` more picks per token, of experts num_experts..num_experts+shared-1) ->
    (order: flat pick indices, T x (top_k + shared), sorted by expert, stable; offsets [num_experts + shared + 1]),
    on the device without a host sync (no bincount: it reads the largest id back to size its output).
    Decode-sized batches in one launch of _sort_picks (torch's radix sort took 9-27 us per MoE layer of a
    V2-Lite decode step on an H200); a prefill's thousands of picks through torch's sort, which spreads over
    the GPU."""
    num_tokens, top_k = ids.shape
    total = num_experts + shared
    num_picks = num_tokens * (top_k + shared)
    if num_picks > ONE_PROGRAM_SORT_PICKS:
        extra = torch.arange(num_experts, total, device=ids.device, dtype=ids.dtype).expand(num_tokens, shared)
        sorted_ids, order = torch.cat((ids, extra), 1).reshape(-1).sort(stable=True)
        bounds = torch.arange(total + 1, device=ids.device, dtype=sorted_ids.dtype)
        return order, torch.searchsorted(sorted_ids, bounds)
    order = torch.empty(num_picks, device=ids.device, dtype=torch.int32)
    offsets = torch.empty(total + 1, device=ids.device, dtype=torch.int32)
    experts_pad = max(16, next_pow2(total))
    block = max(16, min(16384 // experts_pad, next_pow2(num_picks)))  # a [picks, experts] one-hot per step
    _sort_picks[(1,)](ids, order, offsets, num_picks, TOP_K=top_k, SHARED=shared, NUM_EXPERTS=total,
                      EXPERTS_PAD=experts_pad, BLOCK=block, num_warps=4)
    return order, offsets


def fused_moe(x, gate_up, down, weights, ids, shared_gate_up=None, shared_down=None, *, config=None):
    """x [T, hidden]; gate_up [E, 2 x inter, hidden]; down [E, hidden, inter]; weights [T, top_k] float32
    (routing weights, scaling included); ids [T, top_k]; the shared experts (or None): shared_gate_up
    [2 x S x inter, hidden], shared_down [hidden, S x inter]. Returns [T, hidden] in x's dtype."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    inter, top_k = two_inter // 2, ids.shape[1]
    shared = 0 if shared_gate_up is None else shared_gate_up.shape[0] // two_inter
    assert not shared or shared_down.shape[-1] == shared * inter
    if shared_gate_up is None:  # the kernels take a pointer either way; no program reads it
        shared_gate_up, shared_down = gate_up, down
    assert x.stride(-1) == 1 and gate_up.stride(-1) == 1 and down.stride(-1) == 1
    assert shared_gate_up.stride(-1) == 1 and shared_down.stride(-1) == 1
    cpu_tiles = {} if x.device.type == "cuda" else CPU_TILES
    cfg = {**DEFAULT_CONFIG, **cpu_tiles, **(config or {})}
    experts = num_experts + shared
    picks = num_tokens * (top_k + shared)
    block_m = TALL_ROWS if picks >= TALL_PICKS_PER_EXPERT * experts else 16
    order, offsets = sort_picks(ids, num_experts, shared)
    weights = weights.reshape(-1).float().contiguous()
    h = torch.empty(picks, inter, device=x.device, dtype=x.dtype)
    y = torch.empty(picks, hidden, device=x.device, dtype=torch.float32)
    common = dict(HIDDEN=hidden, INTER=inter, TOP_K=top_k, SHARED=shared, NUM_EXPERTS=num_experts,
                  BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
                  DOT_PRECISION=dot_precision(x.dtype), UPCAST=upcast_dots(x),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    _gate_up[(experts, triton.cdiv(inter, cfg["block_n"]))](
        x, gate_up, shared_gate_up, h, order, offsets, x.stride(0), gate_up.stride(0), gate_up.stride(1),
        shared_gate_up.stride(0), h.stride(0), **common)
    _down[(experts, triton.cdiv(hidden, cfg["block_n"]))](
        h, down, shared_down, y, order, offsets, weights, h.stride(0), down.stride(0), down.stride(1),
        shared_down.stride(0), y.stride(0), **common)
    del h
    out = torch.empty_like(x)
    if num_tokens:
        block = min(1024, next_pow2(hidden))
        _sum_picks[(num_tokens, triton.cdiv(hidden, block))](y, out, out.stride(0), HIDDEN=hidden,
                                                              PICKS=top_k + shared, BLOCK=block, num_warps=4)
    return out
