"""Paged decode (Triton, under the interpreter) against the float32 torch reference: random lengths
(not multiples of the block), scattered block tables, block sizes 8/16/32, GQA ratios 1/4/7/8,
fp32/fp16/bf16, outputs poisoned with NaN before every run."""
import pytest
import torch

pytest.importorskip("triton")

from memcheck import kernels  # noqa: E402
from kernel_helpers import DTYPES, assert_close, poisoned, randn, scattered_block_table  # noqa: E402
from memcheck.kernels import reference  # noqa: E402
from memcheck.kernels.decode import paged_decode  # noqa: E402

RATIOS = {1: (2, 2), 4: (8, 2), 7: (7, 1), 8: (8, 1)}  # GQA ratio -> (query heads, KV heads)


def make_case(seed, block_size, q_heads, kv_heads, head_dim=16, num_seqs=3, max_len=40, dtype=torch.float32,
              lengths=None):
    gen = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(1, max_len + 1, (num_seqs,), generator=gen).tolist()
        lengths[0] = block_size * 2 + 3  # never a multiple of the block
    table, num_blocks = scattered_block_table(lengths, block_size, gen)
    k = randn(gen, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v = randn(gen, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    q = randn(gen, len(lengths), q_heads, head_dim, dtype=dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return q, k, v, table, seq_lens, head_dim ** -0.5


def fp32_reference(q, k, v, table, seq_lens, scale):
    return reference.paged_decode(q.float(), k.float(), v.float(), table, seq_lens, scale)


@pytest.mark.parametrize("ratio", sorted(RATIOS))
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_matches_reference_fp32(block_size, ratio):
    case = make_case(block_size * 10 + ratio, block_size, *RATIOS[ratio])
    out = paged_decode(*case, out=poisoned(case[0]))
    assert_close(out, fp32_reference(*case))


@pytest.mark.parametrize("dtype,block_size,ratio", [
    ("float16", 8, 7), ("float16", 16, 1), ("float16", 32, 4),
    ("bfloat16", 8, 4), ("bfloat16", 16, 8), ("bfloat16", 32, 7),
])
def test_matches_reference_half_precision(dtype, block_size, ratio):
    case = make_case(block_size + ratio, block_size, *RATIOS[ratio], dtype=DTYPES[dtype])
    out = paged_decode(*case, out=poisoned(case[0]))
    assert out.dtype == DTYPES[dtype]
    assert_close(out, fp32_reference(*case))


@pytest.mark.parametrize("min_tiles", [1, 3])
@pytest.mark.parametrize("num_programs", [1, 5, 40])
def test_any_split_of_the_work_gives_the_same_answer(num_programs, min_tiles):
    # One long and several short sequences, one empty: units cut across programs, programs that
    # cover several units, and (40) more programs than tiles, some with nothing to do; with min_tiles 3
    # fewer, longer ranges (programs past them idle).
    case = make_case(num_programs, 8, 8, 2, lengths=[37, 0, 5, 19, 1])
    out = paged_decode(*case, out=poisoned(case[0]), num_programs=num_programs, config={"min_tiles": min_tiles})
    ref = fp32_reference(*case)
    assert_close(out, ref)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # nothing cached: zeros, not NaN


@pytest.mark.parametrize("unroll_j, few_j", [(0, 0), (0, 32), (64, 0)],
                         ids=["partials-as-one-tile", "few-partials-unrolled-at-run-time", "partials-unrolled"])
@pytest.mark.parametrize("per_sm", [0, 1, 10**6], ids=["all-rows", "rows-halved", "least-blocks"])
@pytest.mark.parametrize("ratio", [4, 7])
def test_one_long_sequence_merged_from_more_partials_than_a_combine_step_takes(monkeypatch, ratio, per_sm, unroll_j,
                                                                               few_j):
    """One sequence cut over 20 programs per KV head: the combine merges them in several steps of J partials, and
    an idle program past the line's tiles changes nothing. The combine's grains: every row of a unit in one program
    (many sequences), the rows halved until the CPU's 4 multiprocessors have a program each, and blocks of two rows
    and the least columns (7 rows leave the last block half empty); a step's partials as one tile or unrolled, or, in
    a launch sized for one tile a step, the sequence's 20 partials found fewer than 32 and unrolled in one step."""
    from memcheck.kernels import work_split

    monkeypatch.setattr(work_split, "COMBINE_PROGRAMS_PER_SM", per_sm)
    monkeypatch.setattr(work_split, "COMBINE_UNROLL_J", unroll_j)
    monkeypatch.setattr(work_split, "COMBINE_FEW_J", few_j)
    monkeypatch.setattr(work_split, "COMBINE_J_SPLIT", 8)  # the GPU's 64 would take 20 partials in one step
    q_heads, kv_heads = RATIOS[ratio]
    case = make_case(3, 8, q_heads, kv_heads, lengths=[16 * 20 + 3])  # 21 tiles of 16 keys on the CPU
    for num_programs in (kv_heads * 20, kv_heads * 30):
        assert_close(paged_decode(*case, out=poisoned(case[0]), num_programs=num_programs), fp32_reference(*case))


@pytest.mark.parametrize("head_dim", [24, 64])
def test_head_dims_that_need_masking_or_more_width(head_dim):
    case = make_case(head_dim, 16, 8, 2, head_dim=head_dim)
    assert_close(paged_decode(*case, out=poisoned(case[0])), fp32_reference(*case))


def test_public_entry_point_runs_the_kernel_under_the_interpreter_and_the_reference_without(monkeypatch):
    case = make_case(3, 16, 8, 2)
    ref = fp32_reference(*case)
    assert_close(kernels.paged_decode(*case), ref)  # TRITON_INTERPRET=1 (conftest)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert_close(kernels.paged_decode(*case), ref)  # the torch reference


def test_reference_equals_dense_attention_in_float64():
    q, k, v, table, seq_lens, scale = make_case(11, 8, 8, 2, dtype=torch.float64)
    out = reference.paged_decode(q, k, v, table, seq_lens, scale)
    for i, n in enumerate(seq_lens.tolist()):
        keys = torch.cat([k[b] for b in table[i].tolist()])[:n]  # [n, kv_heads, d]
        vals = torch.cat([v[b] for b in table[i].tolist()])[:n]
        for h in range(q.shape[1]):
            kv_head = h // (q.shape[1] // k.shape[2])
            p = torch.softmax(keys[:, kv_head] @ q[i, h] * scale, 0)
            torch.testing.assert_close(out[i, h], p @ vals[:, kv_head], rtol=1e-5, atol=1e-6)  # fp32 math
