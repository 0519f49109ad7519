"""Prefill over the paged KV cache on Hopper (sm_90), in Gluon: FlashAttention-3's warp specialization.

kernels/prefill.py's Triton kernel runs a program's two warpgroups in step: each issues a key tile's products, then
waits on its scores before the exponentials, so the tensor cores idle while the softmax runs (1.8-2.7x of the FLOP
floor on the H200; kernels_h200_2026-12-02_notes.md). Here a program's 128 query rows (one query head) are split
between two 4-warp consumer partitions of 64 rows each, and a one-warp producer partition fills a ring of key and
value tiles with TMA: each 128-key tile is gathered block by block from the paged cache (one TMA box a cache block
of its tokens), signalled on the stage's `k_ready` and `v_ready` mbarriers as the bytes land. The consumers never
load: each scores its rows against the tile, runs the online softmax, and multiplies P (kept in registers) by the
values, then frees the stage (`kv_free`, both consumers). The two consumers drift apart, so one's softmax runs under
the other's products.

Same problem and grid as prefill.py's: sequence i's new tokens are the last q_len of its seq_len cached tokens, causal
among themselves, the prefix seen in full; the last query tiles launch first (prefill.prefill_grid, the caller's).
Key tiles below a consumer's first row run without the mask. The value rows past the sequence's end in its last tile
are zeroed in shared memory before they are used, as a cache's unwritten slots may hold anything (0 x NaN would reach
the output). Triton's interpreter cannot run Gluon: its answers are checked on the GPU by
benchmarks/prefill_hopper_h200.py.
"""
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_M, BLOCK_N, HALF_M = 128, 128, 64  # query rows a program (two consumers of 64), keys a tile
CONSUMER_WARPS, PRODUCER_WARPS = 4, 1
# 12 warps (the producer's warpgroup counted whole): 168 registers a thread on average fill the multiprocessor's 64K.
# The producer gets the minimum, the second consumer 240, the first (the default partition) what is left: 240.
MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 168, 240, 24
STAGES = 2  # key and value tiles in flight: 2 x 64 KiB, with the query tile 160 KiB of shared memory
OVERLAP = False  # _consumer's OVERLAP
WARPS_C, REGS_C = gl.constexpr([CONSUMER_WARPS, PRODUCER_WARPS]), gl.constexpr([CONSUMER_REGS, PRODUCER_REGS])


def supported(q, k_cache, v_cache) -> bool:
    """This kernel's shapes: a Hopper GPU, bf16 or fp16, head_dim 128, cache blocks of a power of two tokens whose
    rows (token, KV head) are 16-byte aligned and dense within a block, as TMA reads them."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    return (q.device.type == "cuda" and _is_hopper(q.device.index) and q.dtype in (torch.bfloat16, torch.float16)
            and q.dtype == k_cache.dtype == v_cache.dtype and head_dim == 128 and q.shape[-1] == head_dim
            and block_size & (block_size - 1) == 0 and block_size >= 8
            and q.stride(1) == head_dim and q.stride(0) % 8 == 0 and q.data_ptr() % 16 == 0
            and all(_token_rows(c) is not None for c in (k_cache, v_cache)))


@functools.lru_cache(maxsize=None)
def _is_hopper(device_index) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def _token_rows(cache):
    """The cache as a 2-D [blocks x block_size, kv_heads x head_dim] view's row stride (None where a block's tokens
    are not evenly strided): one row a token, a KV head's 128 values at column kv_head x 128."""
    _, block_size, kv_heads, head_dim = cache.shape
    s_block, s_tok, s_head, s_dim = cache.stride()
    if s_dim != 1 or s_head != head_dim or s_block != block_size * s_tok or s_tok % 8 or cache.data_ptr() % 16:
        return None
    return s_tok


def _descriptor(t, rows, row_stride, cols, box):
    layout = gl.NVMMASharedLayout.get_default_for(box, gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16)
    return TensorDescriptor(t, [rows, cols], [row_stride, 1], box, layout)


@gluon.jit
def _program(tiles_first):
    """(query tile, query head, sequence) of prefill.prefill_grid's grid: the last query tile first."""
    if tiles_first != 0:
        tile = gl.num_programs(0) - 1 - gl.program_id(0)
        head = gl.program_id(1)
        seq = gl.program_id(2)
    else:
        tile = gl.num_programs(2) - 1 - gl.program_id(2)
        head = gl.program_id(0)
        seq = gl.program_id(1)
    return tile, head, seq


@gluon.jit
def _load_tile(desc, i, bt_row, seq_blocks, kv_head, bar, dest, BLOCK_SIZE: gl.constexpr):
    """Key tile i's keys or values, block by block (one TMA box a cache block of its tokens), arriving on `bar`."""
    BOX: gl.constexpr = desc.block_type.shape[0]  # tokens a TMA box: a cache block's, at most a tile's
    mbarrier.expect(bar, (128 // BOX) * desc.block_type.nbytes)
    for j in gl.static_range(128 // BOX):
        tok = i * 128 + j * BOX
        b = tok // BLOCK_SIZE  # past the sequence's blocks (its last tile): block 0, masked by the consumers
        block = gl.load(bt_row + b, mask=b < seq_blocks, other=0)
        row = block * BLOCK_SIZE + tok % BLOCK_SIZE
        tma.async_copy_global_to_shared(desc, [row, kv_head * desc.block_type.shape[1]], bar, dest.slice(j * BOX, BOX))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_s, k_s, v_s, bars, bt_row, q_row, head, kv_head, n_tiles, seq_blocks,
              BLOCK_SIZE: gl.constexpr):
    """The query tile once, then every key tile's K and, a tile behind, its V into the ring of stages, each once both
    consumers are done with the stage's last one."""
    q_ready, k_ready, v_ready, k_free, v_free = bars
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    STAGES: gl.constexpr = k_s.type.shape[0]
    mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, head * HEAD_DIM], q_ready, q_s.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + 64, head * HEAD_DIM], q_ready, q_s.index(1))
    for i in range(n_tiles + 1):
        if i < n_tiles:
            stage = i % STAGES
            mbarrier.wait(k_free.index(stage), ((i // STAGES) & 1) ^ 1)
            _load_tile(k_desc, i, bt_row, seq_blocks, kv_head, k_ready.index(stage), k_s.index(stage), BLOCK_SIZE)
        if i > 0:  # the values a tile behind: a consumer needs tile i's keys before tile i - 1's values
            stage = (i - 1) % STAGES
            mbarrier.wait(v_free.index(stage), (((i - 1) // STAGES) & 1) ^ 1)
            _load_tile(v_desc, i - 1, bt_row, seq_blocks, kv_head, v_ready.index(stage), v_s.index(stage),
                       BLOCK_SIZE)


@gluon.jit
def _zero_past_end(v_tile, valid, layout: gl.constexpr):
    """Zero a value tile's rows from `valid` on (both consumers may do it at once: they write the same values)."""
    rows = gl.arange(0, 128, gl.SliceLayout(1, layout))
    v = v_tile.load(layout)
    v_tile.store(gl.where((rows < valid)[:, None], v, gl.zeros_like(v)))
    fence_async_shared()  # for the wgmma (the async proxy) that reads it next
    gl.thread_barrier()


@gluon.jit
def _softmax_step(s, i, whole, q_pos, cols, qk_scale, m, l):
    """Tile i's scores into the online softmax: P (unnormalized, in the frame of the new max), the new max, the old
    frame's factor and the row sums. Tiles from `whole` on are masked causally."""
    s = s * qk_scale
    if i >= whole:
        s = gl.where((i * 128 + cols)[None, :] <= q_pos[:, None], s, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, axis=1))  # finite from tile 0 on: every row sees key 0
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(s - m_new[:, None])
    return p, m_new, alpha, l * alpha + gl.sum(p, axis=1)


@gluon.jit
def _values(acc, p, v_s, v_ready, i, seq_len, p_regs: gl.constexpr, ld: gl.constexpr):
    """Issue acc += P x V of tile i once its values are in (the rows past the sequence's end zeroed first)."""
    STAGES: gl.constexpr = v_s.type.shape[0]
    v = v_s.index(i % STAGES)
    mbarrier.wait(v_ready.index(i % STAGES), (i // STAGES) & 1)
    if (i + 1) * 128 > seq_len:
        _zero_past_end(v, seq_len - i * 128, ld)
    return warpgroup_mma(gl.convert_layout(p.to(v_s.dtype), p_regs), v, acc, is_async=True)


@gluon.jit
def _consumer(ME: gl.constexpr, q_s, k_s, v_s, bars, out_ptr, stride_o_tok, stride_o_head, qk_scale, q_start, q_len,
              prefix, seq_len, q_tile, head, n_tiles, OVERLAP: gl.constexpr):
    """Rows ME x 64 .. + 63 of the query tile: the online softmax over the program's key tiles, then the output.
    OVERLAP: FlashAttention-3's intra-warpgroup pipelining, tile i's scores issued before tile i - 1's P x V, and
    its exponentials computed while that runs."""
    q_ready, k_ready, v_ready, k_free, v_free = bars
    HEAD_DIM: gl.constexpr = q_s.type.shape[2]
    STAGES: gl.constexpr = k_s.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 128, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    first = q_tile * 128 + ME * 64  # index among the new tokens of this consumer's first row
    q_pos = prefix + first + gl.arange(0, 64, gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, 128, gl.SliceLayout(0, s_layout))
    whole = gl.minimum((prefix + first + 1) // 128, n_tiles)  # tiles every row of it sees in full
    q = q_s.index(ME)
    zeros = gl.zeros([64, 128], gl.float32, s_layout)

    m = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([64, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_ready, 0)
    if OVERLAP:
        mbarrier.wait(k_ready.index(0), 0)
        s = warpgroup_mma_wait(0, deps=[warpgroup_mma(q, k_s.index(0).permute((1, 0)), zeros, is_async=True)])
        mbarrier.arrive(k_free.index(0), count=1)
        p, m, alpha, l = _softmax_step(s, 0, whole, q_pos, cols, qk_scale, m, l)
        for i in range(1, n_tiles):
            mbarrier.wait(k_ready.index(i % STAGES), (i // STAGES) & 1)
            s = warpgroup_mma(q, k_s.index(i % STAGES).permute((1, 0)), zeros, is_async=True)
            acc = _values(acc, p, v_s, v_ready, i - 1, seq_len, p_regs, ld)
            s = warpgroup_mma_wait(1, deps=[s])  # the scores (the older group): P x V may still run
            mbarrier.arrive(k_free.index(i % STAGES), count=1)
            p, m, alpha, l = _softmax_step(s, i, whole, q_pos, cols, qk_scale, m, l)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(v_free.index((i - 1) % STAGES), count=1)
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        acc = warpgroup_mma_wait(0, deps=[_values(acc, p, v_s, v_ready, n_tiles - 1, seq_len, p_regs, ld)])
        mbarrier.arrive(v_free.index((n_tiles - 1) % STAGES), count=1)
    else:
        for i in range(n_tiles):
            mbarrier.wait(k_ready.index(i % STAGES), (i // STAGES) & 1)
            s = warpgroup_mma_wait(0, deps=[warpgroup_mma(q, k_s.index(i % STAGES).permute((1, 0)), zeros,
                                                          is_async=True)])
            mbarrier.arrive(k_free.index(i % STAGES), count=1)
            p, m, alpha, l = _softmax_step(s, i, whole, q_pos, cols, qk_scale, m, l)
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            acc = warpgroup_mma_wait(0, deps=[_values(acc, p, v_s, v_ready, i, seq_len, p_regs, ld)])
            mbarrier.arrive(v_free.index(i % STAGES), count=1)

    l = gl.convert_layout(l, rows_o)
    rows = first + gl.arange(0, 64, rows_o)
    dims = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    o_ptrs = out_ptr + (q_start + rows).to(gl.int64)[:, None] * stride_o_tok + head * stride_o_head + dims[None, :]
    gl.store(o_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=(rows < q_len)[:, None])


@gluon.jit(do_not_specialize=["stride_bt_seq", "tiles_first"])
def _prefill_hopper(q_desc, k_desc, v_desc, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr, out_ptr,
                    qk_scale, tiles_first, stride_bt_seq, stride_o_tok, stride_o_head,
                    GROUP: gl.constexpr, BLOCK_SIZE: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr):
    q_tile, head, seq = _program(tiles_first)
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if q_tile * 128 >= q_len:
        return
    seq_len = gl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len
    kv_end = prefix + gl.minimum(q_len, (q_tile + 1) * 128)  # the tile's last query sees no further
    n_tiles = (kv_end + 127) // 128
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    q_s = gl.allocate_shared_memory(q_desc.dtype, [2, 64, HEAD_DIM], q_desc.layout)
    k_s = gl.allocate_shared_memory(k_desc.dtype, [STAGES, 128, HEAD_DIM], k_desc.layout)
    v_s = gl.allocate_shared_memory(v_desc.dtype, [STAGES, 128, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for b in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(b), count=1)
        mbarrier.init(v_ready.index(b), count=1)
        mbarrier.init(k_free.index(b), count=2)  # both consumers
        mbarrier.init(v_free.index(b), count=2)
    bars = (q_ready, k_ready, v_ready, k_free, v_free)
    bt_row = block_table_ptr + seq * stride_bt_seq
    seq_blocks = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    q_row = q_start + q_tile * 128
    gl.warp_specialize([
        (_consumer, (0, q_s, k_s, v_s, bars, out_ptr, stride_o_tok, stride_o_head, qk_scale, q_start, q_len, prefix,
                     seq_len, q_tile, head, n_tiles, OVERLAP)),
        (_consumer, (1, q_s, k_s, v_s, bars, out_ptr, stride_o_tok, stride_o_head, qk_scale, q_start, q_len, prefix,
                     seq_len, q_tile, head, n_tiles, OVERLAP)),
        (_producer, (q_desc, k_desc, v_desc, q_s, k_s, v_s, bars, bt_row, q_row, head, head // GROUP, n_tiles,
                     seq_blocks, BLOCK_SIZE)),
    ], WARPS_C, REGS_C)


def paged_prefill_hopper(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, qk_scale, grid, tiles_first, out,
                         *, stages=STAGES, overlap=OVERLAP):
    """prefill.paged_prefill on this kernel (supported() must hold), over prefill.prefill_grid's grid of BLOCK_M-row
    query tiles by query heads by sequences. qk_scale: the softmax scale times log2(e)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    box = [min(block_size, BLOCK_N), head_dim]
    q_desc = _descriptor(q, num_tokens, q.stride(0), num_q_heads * head_dim, [HALF_M, head_dim])
    k_desc = _descriptor(k_cache, num_blocks * block_size, _token_rows(k_cache), num_kv_heads * head_dim, box)
    v_desc = _descriptor(v_cache, num_blocks * block_size, _token_rows(v_cache), num_kv_heads * head_dim, box)
    _prefill_hopper[grid](q_desc, k_desc, v_desc, block_table, cu_seqlens_q, seq_lens, out,
                          qk_scale, tiles_first, block_table.stride(0), out.stride(0), out.stride(1),
                          GROUP=num_q_heads // num_kv_heads, BLOCK_SIZE=block_size, STAGES=stages, OVERLAP=overlap,
                          num_warps=CONSUMER_WARPS, maxnreg=MAXNREG)
    return out
