"""Prefill and chunked prefill over the paged KV cache, variable lengths in one launch, in Triton.

The new tokens' K/V are written to the cache first (kernels.write_kv); attention then reads
every key from the cache. Sequence i's new tokens are the last q_len of its seq_len tokens:
each attends to the cached prefix in full and causally within the new chunk. A plain prefill
is the case prefix = 0; a decode step is q_len = 1.

One program takes BLOCK_Q new tokens of one sequence times the query heads of one KV head:
its rows are (token, head-in-group) pairs, so one K/V tile serves the whole group (a group of 7
is padded to 8 rows a token). With one_head_per_program, a program's rows are BLOCK_Q tokens of
one query head instead: no padding, and the group's programs read the same K/V tiles (from L2,
the work is compute-bound). With split_causal, the key tiles that every row of the program sees
in full (those before its first token's position) run without the causal mask, and only the
tiles on the diagonal apply it; the tiles before it load and score with no mask at all.

The last query tiles launch first: their causal rows see the most keys. A grid of a few waves launches a tile's units
(query heads, or KV heads) side by side, every unit's heaviest tile first, so its last wave holds the shortest
programs; a larger grid launches a unit's tiles together instead, as they read the same keys from L2 (prefill_grid).
"""
import torch
import triton
import triton.language as tl

from .dispatch import dot_precision, fix_triton_interpreter, next_pow2, sm_count, upcast_dots
from .decode import attend_more_tokens
from .dot import dot, softmax_update

try:  # Gluon (triton.experimental.gluon, Triton 3.5 on): without it, the Triton kernel everywhere
    from . import prefill_hopper
except ImportError:
    prefill_hopper = None

fix_triton_interpreter()

LOG2E = 1.4426950408889634
# On the GPU: query rows per program (tokens x heads in the group, or tokens of one head), keys per loop step, warps,
# pipeline depth, whether the tiles below the causal diagonal skip the mask, and whether a program takes one query
# head (benchmarks/kernels_h200.py --grid --config-sweep): one 32K prompt at 1.89x of the FLOP floor on the H200.
# hopper: on an sm_90 GPU, memcheck/kernels/prefill_hopper.py (Gluon, warp-specialized) where its shapes allow.
CONFIG = {"rows": 128, "block_n": 128, "num_warps": 8, "num_stages": 3, "split_causal": True,
          "one_head_per_program": True, "tiles_first": None, "hopper": True}
CPU_CONFIG = {"rows": 16, "block_n": 16}  # the interpreter: small tiles run faster
# tiles_first None: a grid of up to FEW_WAVES programs a multiprocessor launches units side by side (a few waves: the
# last one holds the shortest programs), a larger one a unit's tiles together (they read the same keys from L2):
# dense 2K 0.108 ms against 0.127, 32K 18.36 against 19.30.
FEW_WAVES = 16


@triton.jit
def prefill_program(tiles_first):
    """(query tile, unit, sequence) of a grid made by prefill_grid: the last query tile first. tiles_first is a
    run-time flag (a kernel's do_not_specialize): one compiled kernel takes either order, so a step whose grid
    flips it compiles nothing inside a timed run."""
    last_first = tl.where(tiles_first != 0, tl.num_programs(0) - 1 - tl.program_id(0),
                          tl.num_programs(2) - 1 - tl.program_id(2))
    unit = tl.where(tiles_first != 0, tl.program_id(1), tl.program_id(0))
    seq = tl.where(tiles_first != 0, tl.program_id(2), tl.program_id(1))
    return last_first, unit, seq


def prefill_grid(max_q_len, block_q, units, num_seqs, tiles_first, device):
    """The grid and its order for prefill_program (1: tiles first): tiles_first True or False, or None to choose by
    the grid's waves."""
    tiles = triton.cdiv(max_q_len, block_q)
    if tiles_first is None:
        tiles_first = tiles * units * num_seqs > FEW_WAVES * sm_count(device)
    return ((tiles, units, num_seqs) if tiles_first else (units, num_seqs, tiles)), int(tiles_first)


@triton.jit
def prefill_rows(cu_seqlens_q_ptr, seq_lens_ptr, q_tile, seq, BLOCK_Q: tl.constexpr, PER_TOKEN: tl.constexpr):
    """Query tile q_tile of sequence seq: where the sequence's new tokens start among the packed rows and how many
    there are, the cached tokens before them, and the tile's rows as (new token, k < PER_TOKEN) pairs. The caller
    returns at once when the tile starts past q_len."""
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    rows = tl.arange(0, BLOCK_Q * PER_TOKEN)
    tok = q_tile * BLOCK_Q + rows // PER_TOKEN  # index among the new tokens
    return q_start, q_len, tl.load(seq_lens_ptr + seq) - q_len, tok, rows % PER_TOKEN


@triton.jit
def _tile(ptr, bt_row, t0, kv_head, stride_block, stride_tok, stride_head, dims,
          HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys or values of the BLOCK_N tokens from t0, all of them in the sequence: no mask on tokens."""
    toks = t0 + tl.arange(0, BLOCK_N)
    blocks = tl.load(bt_row + toks // BLOCK_SIZE).to(tl.int64)
    rows = blocks * stride_block + (toks % BLOCK_SIZE) * stride_tok + kv_head * stride_head
    if HEAD_DIM == HEAD_DIM_PAD:
        return tl.load(ptr + rows[:, None] + dims[None, :])
    return tl.load(ptr + rows[:, None] + dims[None, :], mask=(dims < HEAD_DIM)[None, :], other=0.0)


@triton.jit
def attend_whole_tiles(q, k_ptr, v_ptr, bt_row, kv_head, end, qk_scale,
                       stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok, stride_v_head,
                       ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax of q's ROWS rows over tokens [0, end), end a multiple of BLOCK_N, that every row sees in full:
    (max, sum, unnormalized out)."""
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PAD], tl.float32)
    dims = tl.arange(0, HEAD_DIM_PAD)
    for t0 in range(0, end, BLOCK_N):
        k = _tile(k_ptr, bt_row, t0, kv_head, stride_k_block, stride_k_tok, stride_k_head, dims, HEAD_DIM,
                  HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N)
        s = dot(q, tl.trans(k), DOT_PRECISION, UPCAST)
        m, l, p, alpha = softmax_update(s, qk_scale, None, None, None, m, l, False, False)
        v = _tile(v_ptr, bt_row, t0, kv_head, stride_v_block, stride_v_tok, stride_v_head, dims, HEAD_DIM,
                  HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
    return m, l, acc


@triton.jit(do_not_specialize=["stride_bt_seq", "tiles_first"])  # (see work_split.RUN_TIME_INTS)
def _prefill(
    q_ptr, k_ptr, v_ptr, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr, out_ptr,
    qk_scale, tiles_first,
    stride_q_tok, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq,
    stride_o_tok, stride_o_head,
    GROUP: tl.constexpr, HEADS_PER_TOKEN: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Units: KV heads (HEADS_PER_TOKEN rows a token: the group, padded) or query heads (1 row a token)."""
    q_tile, unit, seq = prefill_program(tiles_first)
    if HEADS_PER_TOKEN == 1:
        kv_head = unit // GROUP
        first_head = unit
    else:
        kv_head = unit
        first_head = kv_head * GROUP
    q_start, q_len, prefix, tok, in_group = prefill_rows(cu_seqlens_q_ptr, seq_lens_ptr, q_tile, seq, BLOCK_Q,
                                                         HEADS_PER_TOKEN)
    if q_tile * BLOCK_Q >= q_len:
        return
    row_mask = (tok < q_len) & (in_group < GROUP)
    heads = first_head + in_group
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    q_off = (q_start + tok).to(tl.int64)[:, None] * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    q_pos = prefix + tok  # position in the sequence: sees keys 0..q_pos

    kv_end = prefix + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)  # the tile's last query sees no further
    bt_row = block_table_ptr + seq * stride_bt_seq
    masked_from = 0
    if SPLIT_CAUSAL:  # whole key tiles before the first row's position: every row sees all of them
        masked_from = (prefix + q_tile * BLOCK_Q) // BLOCK_N * BLOCK_N
    m, l, acc = attend_whole_tiles(q, k_ptr, v_ptr, bt_row, kv_head, masked_from, qk_scale,
                                   stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok,
                                   stride_v_head, BLOCK_Q * HEADS_PER_TOKEN, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE,
                                   BLOCK_N, DOT_PRECISION, UPCAST)
    m, l, acc = attend_more_tokens(m, l, acc, q, k_ptr, v_ptr, bt_row, kv_head, masked_from, kv_end, qk_scale,
                                   stride_k_block, stride_k_tok, stride_k_head, stride_v_block, stride_v_tok,
                                   stride_v_head, q_pos, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, True,
                                   DOT_PRECISION, UPCAST)

    l = tl.where(l == 0.0, 1.0, l)
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :]
    tl.store(out_ptr + o_off, (acc / l[:, None]).to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & dim_mask[None, :])


def paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, max_q_len=None, *, out=None,
                  config=None):
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    group = num_q_heads // num_kv_heads
    cfg = {**CONFIG, **(CPU_CONFIG if q.device.type == "cpu" else {}), **(config or {})}
    if (cfg["hopper"] and prefill_hopper is not None and prefill_hopper.supported(q, k_cache, v_cache)
            and cu_seqlens_q.dtype == seq_lens.dtype == torch.int32):  # the Gluon kernel's index types
        grid, tiles_first = prefill_grid(max_q_len, prefill_hopper.BLOCK_M, num_q_heads, num_seqs, cfg["tiles_first"],
                                         q.device)
        return prefill_hopper.paged_prefill_hopper(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
                                                   scale * LOG2E, grid, tiles_first, out,
                                                   stamps=cfg.get("stamps"))
    heads_per_token = 1 if cfg["one_head_per_program"] else next_pow2(group)
    block_q = max(1, cfg["rows"] // heads_per_token)
    grid, tiles_first = prefill_grid(max_q_len, block_q, num_q_heads if heads_per_token == 1 else num_kv_heads,
                                     num_seqs, cfg["tiles_first"], q.device)
    _prefill[grid](
        q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, out,
        scale * LOG2E, tiles_first,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEADS_PER_TOKEN=heads_per_token,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_N=cfg["block_n"], SPLIT_CAUSAL=cfg["split_causal"],
        DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(q),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out
