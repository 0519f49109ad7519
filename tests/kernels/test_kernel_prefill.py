"""Prefill and chunked prefill over a paged context (Triton, under the interpreter) against the
float32 reference: variable lengths in one launch, some sequences with a cached prefix, causal
within the new chunk."""
import pytest
import torch

pytest.importorskip("triton")

from memcheck import kernels  # noqa: E402
from kernel_helpers import DTYPES, assert_close, poisoned, randn, scattered_block_table  # noqa: E402
from memcheck.kernels import reference  # noqa: E402
from memcheck.kernels.prefill import paged_prefill  # noqa: E402

RATIOS = {1: (2, 2), 4: (8, 2), 7: (7, 1), 8: (8, 1)}


def make_case(seed, block_size, q_heads, kv_heads, prefixes, new, head_dim=16, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    lengths = [p + n for p, n in zip(prefixes, new)]
    table, num_blocks = scattered_block_table(lengths, block_size, gen)
    k = randn(gen, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v = randn(gen, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    q = randn(gen, sum(new), q_heads, head_dim, dtype=dtype)
    cu = torch.tensor([0] + new).cumsum(0).to(torch.int32)
    return q, k, v, table, cu, torch.tensor(lengths, dtype=torch.int32), head_dim ** -0.5


def fp32_reference(q, k, v, table, cu, seq_lens, scale):
    return reference.paged_prefill(q.float(), k.float(), v.float(), table, cu, seq_lens, scale)


@pytest.mark.parametrize("ratio", sorted(RATIOS))
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_chunked_prefill_matches_reference_fp32(block_size, ratio):
    # a plain prefill, a chunk after a cached prefix (lengths not multiples of the block), a decode-like row
    case = make_case(block_size + ratio, block_size, *RATIOS[ratio], prefixes=[0, block_size + 5, 9], new=[13, 6, 1])
    out = paged_prefill(*case, out=poisoned(case[0]))
    assert_close(out, fp32_reference(*case))


@pytest.mark.parametrize("dtype,ratio", [("float16", 4), ("float16", 7), ("bfloat16", 1), ("bfloat16", 8)])
def test_chunked_prefill_half_precision(dtype, ratio):
    case = make_case(ratio, 16, *RATIOS[ratio], prefixes=[3, 0], new=[17, 5], dtype=DTYPES[dtype])
    assert_close(paged_prefill(*case, out=poisoned(case[0])), fp32_reference(*case))


@pytest.mark.parametrize("config", [{"split_causal": False}, {"split_causal": True},
                                    {"split_causal": True, "rows": 32, "block_n": 32},
                                    {"split_causal": True, "one_head_per_program": True},
                                    {"split_causal": False, "one_head_per_program": True, "rows": 8},
                                    {"one_head_per_program": True, "tiles_first": True},
                                    {"one_head_per_program": False, "tiles_first": False}])
@pytest.mark.parametrize("ratio", [1, 4, 7])
def test_every_layout_and_causal_split_gives_the_answer(ratio, config):
    # long enough that a program's first row sits past whole key tiles: after a cached prefix of 40 tokens
    # and within a 50-token prompt, and a tile boundary that falls inside the 16-token blocks
    case = make_case(20 + ratio, 16, *RATIOS[ratio], prefixes=[0, 40, 3], new=[50, 21, 2])
    out = paged_prefill(*case, out=poisoned(case[0]), config=config)
    assert_close(out, fp32_reference(*case))


def test_a_sequence_with_no_new_tokens_is_skipped():
    case = make_case(5, 8, 8, 2, prefixes=[4, 10, 0], new=[3, 0, 2])
    assert_close(paged_prefill(*case, out=poisoned(case[0]), max_q_len=3), fp32_reference(*case))


def test_one_new_token_each_is_decode():
    q, k, v, table, cu, seq_lens, scale = make_case(6, 16, 8, 2, prefixes=[20, 3, 40], new=[1, 1, 1])
    decode = reference.paged_decode(q.float(), k.float(), v.float(), table, seq_lens, scale)
    assert_close(paged_prefill(q, k, v, table, cu, seq_lens, scale, out=poisoned(q)), decode)


def test_reference_is_causal_attention_over_the_whole_sequence():
    q, k, v, table, cu, seq_lens, scale = make_case(7, 8, 4, 2, prefixes=[5], new=[6], dtype=torch.float64)
    keys = torch.cat([k[b] for b in table[0].tolist()])[:11].repeat_interleave(2, dim=1)  # [11, 4, d]
    vals = torch.cat([v[b] for b in table[0].tolist()])[:11].repeat_interleave(2, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
    scores = scores.masked_fill(torch.ones(6, 11, dtype=torch.bool).tril(5).logical_not(), float("-inf"))
    dense = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vals)
    out = reference.paged_prefill(q, k, v, table, cu, seq_lens, scale)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-6)  # the reference computes in fp32


def test_public_entry_point(monkeypatch):
    case = make_case(8, 16, 8, 2, prefixes=[0, 7], new=[9, 4])
    ref = fp32_reference(*case)
    assert_close(kernels.paged_prefill(*case), ref)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert_close(kernels.paged_prefill(*case), ref)
