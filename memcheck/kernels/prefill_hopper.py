"""Prefill on Hopper (sm_90), in Gluon: FlashAttention-3's warp specialization, over the paged KV cache (dense
attention) or over contiguous per-head keys and values (MLA prefill, decompressed: memcheck/kernels/mla_mha.py).

memcheck/kernels/prefill.py's Triton kernel runs a program's two warpgroups in step: each issues a key tile's products, then
waits on its scores before the exponentials, so the tensor cores idle while the softmax runs (1.8-2.7x of the FLOP
floor on the H200). Here a program's 128 query rows (one query head) are split
between two 4-warp consumer partitions of 64 rows each, and a one-warp producer partition fills a ring of key and
value tiles with TMA: a 128-key tile of the paged cache is gathered block by block (one TMA box a cache block of its
tokens), of contiguous keys in one box, signalled on the stage's `k_ready` and `v_ready` mbarriers as the bytes
land. The consumers never load: each scores its rows against the tile, runs the online softmax, and multiplies P
(kept in registers) by the values; a stage's keys are freed once both have scored them (`k_free`), its values once
both have used them (`v_free`). With FlashAttention-3's intra-warpgroup pipelining a consumer issues tile
i's scores before tile i - 1's P x V and computes tile i's exponentials while that runs; the two consumers drift
apart, so one's softmax also runs under the other's products. The MLA form scores 192-wide rows as two products (the
per-head 128 nope columns, the 64 rope columns every head shares).

Same problem and grid as prefill.py's: sequence i's new tokens are the last q_len of its seq_len tokens, causal
among themselves, the prefix seen in full; the last query tiles launch first (prefill.prefill_grid, the caller's).
Key tiles below a consumer's first row run without the mask. The value rows past the sequence's end in its last tile
are zeroed in shared memory before they are used, as a cache's unwritten slots may hold anything (0 x NaN would reach
the output). Every tensor is read through a 2-D TMA view [tokens, columns] whose head h starts at column h x its
head stride, so views (the stack's q_nope and q_pe, split from one projection) need no copy. Triton's interpreter
cannot run Gluon: its answers are checked on a GPU by tests/gpu (benchmarks/prefill_hopper_h200.py's checks).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .dispatch import on_hopper, sm_count
from .gluon_common import stamp_gluon

BLOCK_M, BLOCK_N, HALF_M = 128, 128, 64  # query rows a program (two consumers of 64), keys a tile
CONSUMER_WARPS, PRODUCER_WARPS = 4, 1
# 12 warps (the producer's warpgroup counted whole): 168 registers a thread on average fill the multiprocessor's 64K.
# The producer gets the minimum, the second consumer 240, the first (the default partition) what is left: 240.
MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 168, 240, 24
# Key and value tiles in flight: dense 3 x 64 KiB and the query tile (224 KiB of shared memory); MLA 2 x 80 KiB and its
# 48 KiB query tile. The third dense stage: 0.97-1.06x the time of two.
STAGES, MLA_STAGES = 3, 2
# Time stamps (a diagnostic, off unless a launch passes a buffer: benchmarks/prefill_timeline.py): the first consumer
# writes, for each of its program's items (row: program x rounds + round), the global timer when it turns to the item,
# when its query has landed, its first scores are in, its last P x V is done, its output is stored, and the item's
# key tiles.
STAMP_NAMES = ("turned", "query", "first scores", "last product", "stored", "tiles")
STAMP_WIDTH = gl.constexpr(len(STAMP_NAMES))
# One program a multiprocessor taking items in rounds where no prompt has more than this many new tokens (8 x 2K: 1.22x
# faster than one program an item); above, one program an item: programs launched in step read the same keys from L2.
PERSISTENT_UP_TO = 8192
WARPS_C, REGS_C = gl.constexpr([CONSUMER_WARPS, PRODUCER_WARPS]), gl.constexpr([CONSUMER_REGS, PRODUCER_REGS])


def supported(q, k_cache, v_cache) -> bool:
    """The dense kernel's shapes: a Hopper GPU, bf16 or fp16, head_dim 128, cache blocks of a power of two tokens
    (at least 8) dense within a block, every row TMA reads 16-byte aligned."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    return (_on_hopper(q) and q.dtype == k_cache.dtype == v_cache.dtype and head_dim == 128
            and q.shape[-1] == head_dim and block_size & (block_size - 1) == 0 and block_size >= 8
            and all(_rows(c) is not None for c in (q, _tokens(k_cache), _tokens(v_cache))))


def mla_supported(q_nope, q_pe, kv, k_pe, v_dim) -> bool:
    """The MLA kernel's shapes: DeepSeek's nope 128 + rope 64 and values 128, bf16 or fp16, TMA-readable rows."""
    return (_on_hopper(q_nope) and q_nope.shape[-1] == 128 and q_pe.shape[-1] == 64 and v_dim == 128
            and q_nope.dtype == q_pe.dtype == kv.dtype == k_pe.dtype and kv.shape[-1] == 256
            and all(_rows(t) is not None for t in (q_nope, q_pe, kv, kv[..., 128:], k_pe.unsqueeze(1))))


def _on_hopper(t) -> bool:
    return on_hopper(t.device) and t.dtype in (torch.bfloat16, torch.float16)


def _tokens(cache):
    """A paged cache [blocks, block_size, heads, dim] as [blocks x block_size, heads, dim] (None where a block's tokens
    are not evenly strided)."""
    s_block, s_tok = cache.stride()[:2]
    return cache.flatten(0, 1) if s_block == cache.shape[1] * s_tok else None


def _rows(t):
    """t [tokens, heads, dim] as TMA reads it: (row stride, head stride, columns of the 2-D view), or None where a
    stride or its start is not 16-byte aligned."""
    if t is None or t.stride(-1) != 1:
        return None
    s_tok, s_head = t.stride(0), t.stride(1)
    if any(x * t.element_size() % 16 for x in (s_tok, s_head)) or t.data_ptr() % 16:
        return None
    return s_tok, s_head, (t.shape[1] - 1) * s_head + t.shape[2]


def _descriptor(t, box_rows):
    """A TMA descriptor over t [tokens, heads, dim] (_rows) with boxes of box_rows tokens of one head, and its head
    stride in columns."""
    s_tok, s_head, cols = _rows(t)
    box = [box_rows, t.shape[2]]
    layout = gl.NVMMASharedLayout.get_default_for(box, gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16)
    return TensorDescriptor(t, [t.shape[0], cols], [s_tok, 1], box, layout), s_head


@gluon.jit
def _item(k, order):
    """This program's item of round k: (whether there is one, query tile, query head, sequence). Items are numbered
    in prefill.prefill_grid's launch order (the last query tiles first: the heaviest) and dealt in a snake, round k
    even to programs 0, 1, ..., odd to P - 1, P - 2, ..., so each program's total stays near the mean. A grid of one
    program an item is prefill_grid's own launch."""
    num_items, num_tiles, num_units, num_seqs, tiles_first = order
    programs = gl.num_programs(0)
    if k % 2 == 0:
        at = k * programs + gl.program_id(0)
    else:
        at = k * programs + programs - 1 - gl.program_id(0)
    valid = at < num_items
    at = gl.minimum(at, num_items - 1)
    if tiles_first != 0:
        tile = num_tiles - 1 - at % num_tiles
        unit = (at // num_tiles) % num_units
        seq = at // (num_tiles * num_units)
    else:
        unit = at % num_units
        seq = (at // num_units) % num_seqs
        tile = num_tiles - 1 - at // (num_units * num_seqs)
    return valid, tile, unit, seq


@gluon.jit
def _geometry(q_tile, seq, problem, BLOCK_SIZE: gl.constexpr, WINDOWED: gl.constexpr):
    """Query tile q_tile of sequence seq: its new tokens' first row and count, the row of its token 0 in the keys
    (contiguous keys), its length and cache blocks (paged), where its new tokens start, where the tile's rows stop
    seeing keys, the first token its keys hold (a window's), and the key tiles from there."""
    cu_seqlens_q_ptr, seq_lens_ptr, window_start, window_end = problem
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if BLOCK_SIZE == 0:
        k_start = gl.load(seq_lens_ptr + seq).to(gl.int32)
        seq_len = gl.load(seq_lens_ptr + seq + 1).to(gl.int32) - k_start
        seq_blocks = 0
    else:
        k_start = 0
        seq_len = gl.load(seq_lens_ptr + seq)
        seq_blocks = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    prefix = seq_len - q_len
    kv_end = prefix + gl.minimum(q_len, (q_tile + 1) * 128)  # the tile's last query sees no further
    t_base = 0
    if WINDOWED:
        t_base = gl.maximum(window_start - k_start, 0)
        k_start = k_start - window_start  # negative where the window starts past its token 0
        kv_end = gl.minimum(kv_end, window_end - window_start - k_start)
    n_tiles = gl.maximum((kv_end - t_base + 127) // 128, 0)
    return q_start, q_len, k_start, seq_len, seq_blocks, prefix, kv_end, t_base, n_tiles


@gluon.jit
def _load_tile(desc, i, k_start, bt_row, seq_blocks, col, bar, dest, BLOCK_SIZE: gl.constexpr):
    """Key tile i's keys or values (columns col..) into dest, arriving on `bar`: from the paged cache block by block
    (one TMA box a cache block of its tokens), or with BLOCK_SIZE 0 from the contiguous rows after k_start."""
    BOX: gl.constexpr = desc.block_type.shape[0]  # tokens a TMA box: a cache block's, at most a tile's
    if BLOCK_SIZE == 0:
        tma.async_copy_global_to_shared(desc, [k_start + i * 128, col], bar, dest)
    else:
        for j in gl.static_range(128 // BOX):
            tok = i * 128 + j * BOX
            b = tok // BLOCK_SIZE  # past the sequence's blocks (its last tile): block 0, masked by the consumers
            block = gl.load(bt_row + b, mask=b < seq_blocks, other=0)
            row = block * BLOCK_SIZE + tok % BLOCK_SIZE
            tma.async_copy_global_to_shared(desc, [row, col], bar, dest.slice(j * BOX, BOX))


@gluon.jit
def _producer(descs, smem, bars, head_cols, problem, order, block_table_ptr, stride_bt_seq, GROUP: gl.constexpr,
              BLOCK_SIZE: gl.constexpr, ROPE: gl.constexpr, WINDOWED: gl.constexpr):
    """For each item: its query tile once both consumers are done with the last one's, then every key tile's K and,
    a tile behind, its V into the ring of stages (continued across items), each once both consumers are done with the
    stage's last one."""
    q_desc, qpe_desc, k_desc, kpe_desc, v_desc = descs
    q_s, qpe_s, k_s, kpe_s, v_s = smem
    q_ready, q_free, k_ready, v_ready, k_free, v_free = bars
    q_cols, qpe_cols, k_cols, v_cols = head_cols
    STAGES: gl.constexpr = k_s.type.shape[0]
    K_BYTES: gl.constexpr = (128 // k_desc.block_type.shape[0]) * k_desc.block_type.nbytes
    items = 0  # items done: the query buffer's fills
    tiles = 0  # key tiles done: the ring's fills
    for k in range(gl.cdiv(order[0], gl.num_programs(0))):
        valid, q_tile, head, seq = _item(k, order)
        q_start, q_len, k_start, seq_len, seq_blocks, prefix, kv_end, t_base, n_tiles = _geometry(
            q_tile, seq, problem, BLOCK_SIZE, WINDOWED)
        if valid & (q_tile * 128 < q_len):
            q_row = q_start + q_tile * 128
            mbarrier.wait(q_free, (items & 1) ^ 1)
            if ROPE > 0:
                mbarrier.expect(q_ready, 2 * (q_desc.block_type.nbytes + qpe_desc.block_type.nbytes))
                tma.async_copy_global_to_shared(qpe_desc, [q_row, head * qpe_cols], q_ready, qpe_s.index(0))
                tma.async_copy_global_to_shared(qpe_desc, [q_row + 64, head * qpe_cols], q_ready, qpe_s.index(1))
            else:
                mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q_row, head * q_cols], q_ready, q_s.index(0))
            tma.async_copy_global_to_shared(q_desc, [q_row + 64, head * q_cols], q_ready, q_s.index(1))
            bt_row = block_table_ptr + seq * stride_bt_seq
            k_row = k_start + t_base
            kv_head = head // GROUP
            for i in range(n_tiles + 1):
                if i < n_tiles:
                    stage = (tiles + i) % STAGES
                    mbarrier.wait(k_free.index(stage), (((tiles + i) // STAGES) & 1) ^ 1)
                    if ROPE > 0:  # the rope keys every head shares, contiguous
                        mbarrier.expect(k_ready.index(stage), K_BYTES + kpe_desc.block_type.nbytes)
                        tma.async_copy_global_to_shared(kpe_desc, [k_row + i * 128, 0], k_ready.index(stage),
                                                        kpe_s.index(stage))
                    else:
                        mbarrier.expect(k_ready.index(stage), K_BYTES)
                    _load_tile(k_desc, i, k_row, bt_row, seq_blocks, kv_head * k_cols, k_ready.index(stage),
                               k_s.index(stage), BLOCK_SIZE)
                if i > 0:  # the values a tile behind: a consumer needs tile i's keys before tile i - 1's values
                    stage = (tiles + i - 1) % STAGES
                    mbarrier.wait(v_free.index(stage), (((tiles + i - 1) // STAGES) & 1) ^ 1)
                    mbarrier.expect(v_ready.index(stage),
                                    (128 // v_desc.block_type.shape[0]) * v_desc.block_type.nbytes)
                    _load_tile(v_desc, i - 1, k_row, bt_row, seq_blocks, kv_head * v_cols, v_ready.index(stage),
                               v_s.index(stage), BLOCK_SIZE)
            items += 1
            tiles += n_tiles


@gluon.jit
def _zero_past_end(v_tile, valid, layout: gl.constexpr):
    """Zero a value tile's rows from `valid` on (both consumers may do it at once: they write the same values)."""
    rows = gl.arange(0, 128, gl.SliceLayout(1, layout))
    v = v_tile.load(layout)
    v_tile.store(gl.where((rows < valid)[:, None], v, gl.zeros_like(v)))
    fence_async_shared()  # for the wgmma (the async proxy) that reads it next
    gl.thread_barrier()


@gluon.jit
def _scores(q_s, qpe_s, k_s, kpe_s, k_ready, ME: gl.constexpr, c, zeros, ROPE: gl.constexpr):
    """Issue the scores of the ring's c-th key tile for this consumer's rows (nope, then rope columns where there are
    any) once its keys are in."""
    STAGES: gl.constexpr = k_s.type.shape[0]
    mbarrier.wait(k_ready.index(c % STAGES), (c // STAGES) & 1)
    s = warpgroup_mma(q_s.index(ME), k_s.index(c % STAGES).permute((1, 0)), zeros, is_async=True)
    if ROPE > 0:
        s = warpgroup_mma(qpe_s.index(ME), kpe_s.index(c % STAGES).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _softmax_step(s, i, whole, t_base, q_pos, kv_end, qk_scale, m, l, WINDOWED: gl.constexpr):
    """Tile i's unscaled scores (t_base: tile 0's first key's position) into the online softmax: P (unnormalized, in
    the frame of the new max), the new max, the old frame's factor and the row sums. Tiles from `whole` on are masked
    (causally, and keys from kv_end on). The max is kept scaled (qk_scale > 0: the unscaled scores' max, scaled, is the
    scaled scores' max)."""
    if i >= whole:
        keys = t_base + i * 128 + gl.arange(0, 128, gl.SliceLayout(0, s.type.layout))
        s = gl.where((keys[None, :] <= q_pos[:, None]) & (keys < kv_end)[None, :], s, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, axis=1) * qk_scale)
    frame = m_new  # finite from tile 0 on, unless WINDOWED: every row sees its sequence's key 0
    if WINDOWED:  # a row may have seen no key of the window yet (its max -inf): P and alpha 0, not NaN
        frame = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m - frame)
    p = gl.exp2(s * qk_scale - frame[:, None])
    return p, m_new, alpha, l * alpha + gl.sum(p, axis=1)


@gluon.jit
def _values(acc, p, v_s, v_ready, c, rest, p_regs: gl.constexpr, ld: gl.constexpr):
    """Issue acc += P x V of the ring's c-th tile once its values are in (its rows past the sequence's end, `rest`
    tokens from its first, zeroed first)."""
    STAGES: gl.constexpr = v_s.type.shape[0]
    v = v_s.index(c % STAGES)
    mbarrier.wait(v_ready.index(c % STAGES), (c // STAGES) & 1)
    if rest < 128:
        _zero_past_end(v, rest, ld)
    return warpgroup_mma(gl.convert_layout(p.to(v_s.dtype), p_regs), v, acc, is_async=True)


@gluon.jit
def _consumer(ME: gl.constexpr, smem, bars, problem, order, out_ptr, lse_ptr, stride_o_tok, stride_o_head,
              stride_lse_tok, qk_scale, BLOCK_SIZE: gl.constexpr, ROPE: gl.constexpr,
              WINDOWED: gl.constexpr, stamps_ptr, STAMPS: gl.constexpr, WIDE_STORE: gl.constexpr):
    """For each item, rows ME x 64 .. + 63 of its query tile: the online softmax over its key tiles (tile i: the
    sequence's tokens t_base + i x 128 ..), then the output (WINDOWED: with each row's log2-sum-exp, -inf where it saw
    no key). Tile i's scores are issued before tile i - 1's P x V, its exponentials computed while that runs."""
    q_s, qpe_s, k_s, kpe_s, v_s = smem
    q_ready, q_free, k_ready, v_ready, k_free, v_free = bars
    V_DIM: gl.constexpr = v_s.type.shape[2]
    STAGES: gl.constexpr = k_s.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 128, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, V_DIM, 16])
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    zeros = gl.zeros([64, 128], gl.float32, s_layout)
    items = 0
    tiles = 0
    for k in range(gl.cdiv(order[0], gl.num_programs(0))):
        valid, q_tile, head, seq = _item(k, order)
        q_start, q_len, k_start, seq_len, seq_blocks, prefix, kv_end, t_base, n_tiles = _geometry(
            q_tile, seq, problem, BLOCK_SIZE, WINDOWED)
        if valid & (q_tile * 128 < q_len):
            STAMP: gl.constexpr = STAMPS and ME == 0
            stamp_row = gl.program_id(0) * gl.cdiv(order[0], gl.num_programs(0)) + k
            if STAMP:
                stamp_gluon(stamps_ptr, stamp_row, 0, STAMP_WIDTH)
            row0 = q_tile * 128 + ME * 64  # index among the new tokens of this consumer's first row
            q_pos = prefix + row0 + gl.arange(0, 64, gl.SliceLayout(1, s_layout))
            # tiles every row of it sees in full (<= 0 where none: truncated, not floored)
            whole = gl.maximum(gl.minimum(gl.minimum((prefix + row0 + 1 - t_base) // 128, (kv_end - t_base) // 128),
                                          n_tiles), 0)
            tokens = seq_len - t_base  # the sequence's tokens from the first tile's first
            m = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
            l = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_layout))
            acc = gl.zeros([64, V_DIM], gl.float32, o_layout)
            mbarrier.wait(q_ready, items & 1)
            if STAMP:
                stamp_gluon(stamps_ptr, stamp_row, 1, STAMP_WIDTH)
            if n_tiles > 0:
                s = warpgroup_mma_wait(0, deps=[_scores(q_s, qpe_s, k_s, kpe_s, k_ready, ME, tiles, zeros, ROPE)])
                if STAMP:
                    stamp_gluon(stamps_ptr, stamp_row, 2, STAMP_WIDTH)
                mbarrier.arrive(k_free.index(tiles % STAGES), count=1)
                p, m, alpha, l = _softmax_step(s, 0, whole, t_base, q_pos, kv_end, qk_scale, m, l, WINDOWED)
                for i in range(1, n_tiles):
                    c = tiles + i
                    s = _scores(q_s, qpe_s, k_s, kpe_s, k_ready, ME, c, zeros, ROPE)
                    acc = _values(acc, p, v_s, v_ready, c - 1, tokens - (i - 1) * 128, p_regs, ld)
                    s = warpgroup_mma_wait(1, deps=[s])  # the scores (the older group): P x V may still run
                    mbarrier.arrive(k_free.index(c % STAGES), count=1)
                    # As compiled, ptxas puts the next wait at the top of the block after the mask's branch, above
                    # this softmax: each consumer's softmax runs under the other's products, not its own. The loop
                    # split at the mask, without the branch, keeps the order but spills ~31 registers a tile (P in
                    # float32 and the next scores live at once): 1.2-1.3x the time.
                    p, m, alpha, l = _softmax_step(s, i, whole, t_base, q_pos, kv_end, qk_scale, m, l, WINDOWED)
                    acc = warpgroup_mma_wait(0, deps=[acc])
                    mbarrier.arrive(v_free.index((c - 1) % STAGES), count=1)
                    acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
                if not WIDE_STORE:
                    mbarrier.arrive(q_free, count=1)  # every score of the item done: the next query may load
                c = tiles + n_tiles - 1
                acc = warpgroup_mma_wait(0, deps=[_values(acc, p, v_s, v_ready, c, tokens - (n_tiles - 1) * 128,
                                                          p_regs, ld)])
                if STAMP:
                    stamp_gluon(stamps_ptr, stamp_row, 3, STAMP_WIDTH)
                mbarrier.arrive(v_free.index(c % STAGES), count=1)
            elif not WIDE_STORE:
                mbarrier.arrive(q_free, count=1)

            rows = row0 + gl.arange(0, 64, rows_o)
            tok = (q_start + rows).to(gl.int64)
            if WINDOWED:
                lse = gl.where(l > 0.0, m + gl.log2(l), float("-inf"))
                gl.store(lse_ptr + tok * stride_lse_tok + head, gl.convert_layout(lse, rows_o), mask=rows < q_len)
                l = gl.where(l > 0.0, l, 1.0)
            l = gl.convert_layout(l, rows_o)
            o = (acc / l[:, None]).to(out_ptr.dtype.element_ty)
            if WIDE_STORE:  # through this consumer's query half (its scores are done), then stores of 16 bytes
                mine = q_s.index(ME)
                mine.store(o)
                gl.thread_barrier()
                o = mine.load(ld)
                fence_async_shared()  # these generic reads and writes before the next query's TMA write
                gl.thread_barrier()  # every warp has read it back: the next query may land there
                mbarrier.arrive(q_free, count=1)
                rows = row0 + gl.arange(0, 64, gl.SliceLayout(1, ld))
                tok = (q_start + rows).to(gl.int64)
                dims = gl.arange(0, V_DIM, gl.SliceLayout(0, ld))
            else:
                dims = gl.arange(0, V_DIM, gl.SliceLayout(0, o_layout))
            o_ptrs = out_ptr + tok[:, None] * stride_o_tok + head * stride_o_head + dims[None, :]
            gl.store(o_ptrs, o, mask=(rows < q_len)[:, None])
            if STAMP:
                stamp_gluon(stamps_ptr, stamp_row, 4, STAMP_WIDTH)
                gl.store(stamps_ptr + stamp_row * STAMP_WIDTH + 5, n_tiles.to(gl.int64))
            items += 1
            tiles += n_tiles


@gluon.jit(do_not_specialize=["stride_bt_seq", "window_start", "window_end", "num_items", "num_tiles", "num_seqs",
                              "tiles_first"])  # one variant for every window and batch
def _prefill_hopper(q_desc, qpe_desc, k_desc, kpe_desc, v_desc, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
                    out_ptr, lse_ptr, qk_scale, stride_bt_seq, stride_o_tok, stride_o_head, stride_lse_tok,
                    q_head_cols, qpe_head_cols, k_head_cols, v_head_cols, window_start, window_end,
                    num_items, num_tiles, num_units, num_seqs, tiles_first, stamps_ptr,
                    GROUP: gl.constexpr, BLOCK_SIZE: gl.constexpr, ROPE: gl.constexpr, STAGES: gl.constexpr,
                    WINDOWED: gl.constexpr, STAMPS: gl.constexpr, WIDE_STORE: gl.constexpr):
    """Items: (query tile, query head, sequence), num_items of them (_item), taken by the programs in rounds.
    BLOCK_SIZE > 0: keys and values in the paged cache (block_table_ptr), seq_lens_ptr each sequence's length.
    BLOCK_SIZE 0: contiguous keys, seq_lens_ptr the cumulative lengths (sequence i's keys are rows [cu[i], cu[i+1]).
    ROPE > 0: scores over q/k nope plus rope columns (qpe_desc, kpe_desc: the rope keys shared by every head).
    WINDOWED (contiguous keys): the keys and values hold the packed tokens [window_start, window_end) only; each row
    attends over its sequence's tokens there and writes its log-sum-exp to lse_ptr (mla_mha's context windows).
    STAMPS: time stamps to stamps_ptr (STAMP_NAMES). WIDE_STORE (where the output has the query's dtype and width): the
    output through the query's shared memory, stored 16 bytes a thread (the accumulators' layout stores 4 bytes a
    thread over 8 rows)."""
    q_s = gl.allocate_shared_memory(q_desc.dtype, [2, 64, q_desc.block_type.shape[1]], q_desc.layout)
    k_s = gl.allocate_shared_memory(k_desc.dtype, [STAGES, 128, k_desc.block_type.shape[1]], k_desc.layout)
    v_s = gl.allocate_shared_memory(v_desc.dtype, [STAGES, 128, v_desc.block_type.shape[1]], v_desc.layout)
    if ROPE > 0:
        qpe_s = gl.allocate_shared_memory(qpe_desc.dtype, [2, 64, ROPE], qpe_desc.layout)
        kpe_s = gl.allocate_shared_memory(kpe_desc.dtype, [STAGES, 128, ROPE], kpe_desc.layout)
    else:  # unused
        qpe_s = q_s
        kpe_s = k_s
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_free, count=2)  # both consumers
    for b in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(b), count=1)
        mbarrier.init(v_ready.index(b), count=1)
        mbarrier.init(k_free.index(b), count=2)
        mbarrier.init(v_free.index(b), count=2)
    smem = (q_s, qpe_s, k_s, kpe_s, v_s)
    bars = (q_ready, q_free, k_ready, v_ready, k_free, v_free)
    problem = (cu_seqlens_q_ptr, seq_lens_ptr, window_start, window_end)
    order = (num_items, num_tiles, num_units, num_seqs, tiles_first)
    gl.warp_specialize([
        (_consumer, (0, smem, bars, problem, order, out_ptr, lse_ptr, stride_o_tok, stride_o_head, stride_lse_tok,
                     qk_scale, BLOCK_SIZE, ROPE, WINDOWED, stamps_ptr, STAMPS, WIDE_STORE)),
        (_consumer, (1, smem, bars, problem, order, out_ptr, lse_ptr, stride_o_tok, stride_o_head, stride_lse_tok,
                     qk_scale, BLOCK_SIZE, ROPE, WINDOWED, stamps_ptr, STAMPS, WIDE_STORE)),
        (_producer, ((q_desc, qpe_desc, k_desc, kpe_desc, v_desc), smem, bars,
                     (q_head_cols, qpe_head_cols, k_head_cols, v_head_cols), problem, order, block_table_ptr,
                     stride_bt_seq, GROUP, BLOCK_SIZE, ROPE, WINDOWED)),
    ], WARPS_C, REGS_C)


def rounds_of(items, tiles, device):
    """(programs, rounds each) of a launch of `items` items of `tiles` query tiles a sequence."""
    persistent = tiles * BLOCK_M <= PERSISTENT_UP_TO
    programs = min(items, sm_count(device)) if persistent else items
    return programs, -(-items // programs)


def _launch(grid, descs, block_table, cu_seqlens_q, seq_lens, out, qk_scale, tiles_first, group,
            block_size, rope, stages, stamps=None, lse=None, window=(0, 0)):
    """The kernel over prefill_grid's items (its grid and order): one program an item, or (rounds_of) one a
    multiprocessor (shared memory holds one) taking items in rounds, the next item's query and first keys loaded
    under the last one's end. stamps: None, or int64 [programs x rounds, len(STAMP_NAMES)] at least (rounds_of)."""
    (q_desc, q_hc), (qpe_desc, qpe_hc), (k_desc, k_hc), (kpe_desc, _), (v_desc, v_hc) = descs
    tiles, units, seqs = grid if tiles_first else (grid[2], grid[0], grid[1])
    items = tiles * units * seqs
    programs, _ = rounds_of(items, tiles, out.device)
    assert stamps is None or stamps.dtype == torch.int64, "config stamps: an int64 tensor"
    _prefill_hopper[(programs,)](
        q_desc, qpe_desc, k_desc, kpe_desc, v_desc, block_table, cu_seqlens_q, seq_lens, out,
        out if lse is None else lse, qk_scale, block_table.stride(0) if block_table.dim() == 2 else 0,
        out.stride(0), out.stride(1), 0 if lse is None else lse.stride(0), q_hc, qpe_hc, k_hc, v_hc, *window,
        items, tiles, units, seqs, tiles_first, out if stamps is None else stamps,
        GROUP=group, BLOCK_SIZE=block_size, ROPE=rope, STAGES=stages,
        WINDOWED=lse is not None, STAMPS=stamps is not None,
        WIDE_STORE=out.dtype == q_desc.base.dtype and out.shape[-1] == q_desc.block_shape[1],
        num_warps=CONSUMER_WARPS, maxnreg=MAXNREG)
    return out


def paged_prefill_hopper(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, qk_scale, grid, tiles_first, out,
                         *, stamps=None):
    """prefill.paged_prefill on this kernel (supported() must hold), over prefill.prefill_grid's grid of BLOCK_M-row
    query tiles by query heads by sequences. qk_scale: the softmax scale times log2(e)."""
    block_size = k_cache.shape[1]
    box = min(block_size, BLOCK_N)
    q_desc = _descriptor(q, HALF_M)
    k_desc = _descriptor(_tokens(k_cache), box)
    descs = (q_desc, q_desc, k_desc, k_desc, _descriptor(_tokens(v_cache), box))  # no rope: its slots unused
    return _launch(grid, descs, block_table, cu_seqlens_q, seq_lens, out, qk_scale, tiles_first,
                   q.shape[1] // k_cache.shape[2], block_size, 0, STAGES, stamps)


def mla_prefill_hopper(q_nope, q_pe, kv, k_pe, cu_seqlens_q, cu_seqlens_k, qk_scale, grid, tiles_first, out, lse=None,
                       window=(0, 0), *, stamps=None):
    """mla_mha's decompressed prefill (mla_supported() must hold): q_nope [T, H, 128] and q_pe [T, H, 64] of the new
    tokens, kv [C, H, 256] the context tokens' per-head keys (nope) then values, k_pe [C, 64] their rope keys,
    sequence i's token 0 at row cu_seqlens_k[i]; out [T, H, 128]. With lse [T, H], kv and k_pe hold the packed
    context tokens window = (start, end) only, and lse gets each row's log2-sum-exp (-inf: no key in the window)."""
    descs = (_descriptor(q_nope, HALF_M), _descriptor(q_pe, HALF_M), _descriptor(kv[..., :128], BLOCK_N),
             _descriptor(k_pe.unsqueeze(1), BLOCK_N), _descriptor(kv[..., 128:], BLOCK_N))
    return _launch(grid, descs, cu_seqlens_k, cu_seqlens_q, cu_seqlens_k, out, qk_scale, tiles_first, 1, 0,
                   q_pe.shape[-1], MLA_STAGES, stamps, lse, window)
