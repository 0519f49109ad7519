"""MLA prefill in its decompressed form (Triton, under the interpreter) against the float32 reference; the reference
agrees with plain multi-head attention over the decompressed keys and values, and with the absorbed form (W_UK folded
into the query, attention over the latent, W_UV after), which is the same in exact arithmetic."""
import pytest
import torch

pytest.importorskip("triton")

from memcheck import kernels  # noqa: E402
from kernel_helpers import assert_close, poisoned, randn, scattered_block_table  # noqa: E402
from memcheck.kernels import reference  # noqa: E402
from memcheck.kernels.mla_mha import gather_context, mla_mha_prefill, window_tokens  # noqa: E402


def make_case(seed, block_size, heads, new, prefixes, rank=32, rope=16, nope=16, v_dim=16, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    lengths = [p + n for p, n in zip(prefixes, new)]
    table, num_blocks = scattered_block_table(lengths, block_size, gen)
    cache = randn(gen, num_blocks, block_size, rank + rope, dtype=dtype)
    total = sum(new)
    cu = torch.tensor([0] + new).cumsum(0).to(torch.int32)
    kv_b = (randn(gen, heads * (nope + v_dim), rank) * rank ** -0.5).to(dtype)
    return (randn(gen, total, heads, nope, dtype=dtype), randn(gen, total, heads, rope, dtype=dtype), cache, table,
            cu, torch.tensor(lengths, dtype=torch.int32), kv_b, (nope + rope) ** -0.5)


def fp32_reference(q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale):
    return reference.mla_mha_prefill(q_nope.float(), q_pe.float(), cache.float(), table, cu, seq_lens, kv_b.float(),
                                     scale)


def poisoned_out(case, v_dim=16):
    return poisoned(case[0].new_empty(case[0].shape[0], case[0].shape[1], v_dim))


@pytest.mark.parametrize("start, count", [(0, 88), (5, 40), (37, 1), (87, 1)])
def test_context_gathered_window_by_window_across_sequences(start, count):
    """Each packed context token's latent row, found through its sequence's block table (an empty sequence among
    them), and the cumulative lengths: as the rows of the cache in that order."""
    gen = torch.Generator().manual_seed(7)
    lengths = [30, 0, 1, 57]
    table, num_blocks = scattered_block_table(lengths, 8, gen)
    cache = randn(gen, num_blocks, 8, 40)
    rows, cu_k = gather_context(cache, table, torch.tensor(lengths, dtype=torch.int32), start, count)
    every = torch.cat([cache[table[s, t // 8], t % 8][None] for s, n in enumerate(lengths) for t in range(n)])
    assert torch.equal(rows, every[start:start + count])
    assert cu_k.tolist() == [0, 30, 30, 31, 88]


@pytest.mark.parametrize("heads", [1, 3, 16])
@pytest.mark.parametrize("block_size", [8, 16])
def test_matches_reference_fp32(block_size, heads):
    """A plain prefill, a chunk after a cached prefix (not a multiple of the block) and a one-token chunk, in one
    launch; 40 new tokens run past a query tile, so tiles below the diagonal run unmasked."""
    case = make_case(block_size + heads, block_size, heads, [40, 6, 1], [0, 2 * block_size + 3, 11])
    assert_close(mla_mha_prefill(*case, out=poisoned_out(case)), fp32_reference(*case))


@pytest.mark.parametrize("config", [{"block_m": 32, "block_n": 16}, {"block_m": 16, "block_n": 32},
                                    {"block_m": 16, "tiles_first": True}, {"block_m": 16, "tiles_first": False}])
def test_other_tiles_give_the_same_answer(config):
    case = make_case(3, 16, 2, [37, 20], [5, 0])
    assert_close(mla_mha_prefill(*case, out=poisoned_out(case), config=config), fp32_reference(*case))


def test_the_context_length_given_or_read_from_the_device():
    case = make_case(8, 8, 2, [5, 9, 3], [17, 0, 4])
    ref = fp32_reference(*case)
    assert_close(mla_mha_prefill(*case, max_q_len=9, context_tokens=22 + 9 + 7, out=poisoned_out(case)), ref)
    assert_close(mla_mha_prefill(*case, out=poisoned_out(case)), ref)


@pytest.mark.parametrize("window", [1, 7, 16, 45])
def test_a_context_taken_window_by_window(window):
    """Windows of the packed context (all sequences' tokens) smaller than it: a window that cuts a sequence, one that
    holds several, a sequence with no token in a window; merged, the same attention as in one pass."""
    case = make_case(10 + window, 8, 3, [40, 6, 1], [0, 35, 11])
    out = mla_mha_prefill(*case, out=poisoned_out(case), window=window)
    assert_close(out, fp32_reference(*case))


def test_windows_merged_into_a_bf16_view_of_a_wider_buffer():
    """The stack's out: bf16 rows of a [tokens, heads x v] projection input, here a view with room past each head's
    columns; the last window's merge writes it directly, leaving the rest of the buffer alone."""
    case = make_case(5, 8, 3, [40, 6, 1], [0, 35, 11])
    wide = poisoned(torch.empty(47, 3, 32, dtype=torch.bfloat16))
    out = mla_mha_prefill(*case, out=wide[..., :16], window=9)
    assert_close(out, fp32_reference(*case))
    assert wide[..., 16:].isnan().all()


def test_windows_merged_into_an_output_with_strided_columns():
    """Any out a caller passes: here every other column of a wider buffer, the ones between left alone."""
    case = make_case(6, 8, 2, [40, 6, 1], [0, 35, 11])
    wide = poisoned(case[0].new_empty(47, 2, 32))
    out = mla_mha_prefill(*case, out=wide[..., ::2], window=9)
    assert_close(out, fp32_reference(*case))
    assert wide[..., 1::2].isnan().all()


@pytest.mark.parametrize("tiles_first", [True, False])
def test_windows_in_either_launch_order(tiles_first):
    case = make_case(3, 8, 2, [40, 6, 1], [0, 35, 11])  # 2 heads, 3 sequences: a swapped grid axis shows
    out = mla_mha_prefill(*case, out=poisoned_out(case), window=7, config={"tiles_first": tiles_first})
    assert_close(out, fp32_reference(*case))


def test_widths_that_need_masking():
    case = make_case(4, 8, 2, [9, 4], [0, 7], rank=24, rope=8, nope=24, v_dim=20)
    out = mla_mha_prefill(*case, out=poisoned_out(case, v_dim=20))
    assert out.shape[-1] == 20
    assert_close(out, fp32_reference(*case))


@pytest.mark.parametrize("window", [None, 12])
def test_deepseek_v2_lite_widths_bf16(window):
    case = make_case(5, 16, 2, [7, 3], [0, 20], rank=512, rope=64, nope=128, v_dim=128, dtype=torch.bfloat16)
    assert_close(mla_mha_prefill(*case, out=poisoned_out(case, v_dim=128), window=window), fp32_reference(*case))


def test_the_window_holds_a_gibibyte_of_keys_and_values():
    """V2-Lite's widths (16 heads x (128 + 128) values and the 576-wide latent row, 2 bytes each): 9,344 bytes a
    context token, 114,912 tokens a window."""
    kv_b = torch.empty(16 * 256, 512, dtype=torch.bfloat16)
    assert window_tokens(kv_b, torch.empty(1, 16, 576, dtype=torch.bfloat16)) == (1 << 30) // (16 * 256 * 2 + 576 * 2)


def test_reference_equals_multi_head_attention_over_the_decompressed_context():
    q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale = make_case(6, 8, 3, [5], [7], dtype=torch.float64)
    rows = torch.cat([cache[b] for b in table[0].tolist()])[:12]  # the sequence's 12 latent rows
    kv = (rows[:, :32] @ kv_b.T).view(12, 3, 32)
    keys = torch.cat([kv[..., :16], rows[:, None, 32:].expand(12, 3, 16)], dim=-1)  # k_pe shared by the heads
    scores = torch.einsum("qhd,khd->hqk", torch.cat([q_nope, q_pe], dim=-1), keys) * scale
    scores = scores.masked_fill(torch.ones(5, 12, dtype=torch.bool).tril(7).logical_not(), float("-inf"))
    dense = torch.einsum("hqk,khd->qhd", scores.softmax(-1), kv[..., 16:])
    out = reference.mla_mha_prefill(q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale)
    torch.testing.assert_close(out.double(), dense, rtol=1e-5, atol=1e-6)  # the reference computes in fp32


def test_reference_equals_the_absorbed_form():
    """The decode kernels' form of the same attention: W_UK folded into the query, the latent as one shared key and
    value head (reference.mla_prefill), W_UV after."""
    q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale = make_case(7, 8, 4, [6, 1, 9], [10, 4, 0],
                                                                      dtype=torch.float64)
    w = kv_b.view(4, 32, 32)  # [H, nope + v, rank]
    q_latent = torch.einsum("thn,hnr->thr", q_nope, w[:, :16])
    latent_out = reference.mla_prefill(q_latent, q_pe, cache, table, cu, seq_lens, scale)
    absorbed = torch.einsum("thr,hvr->thv", latent_out, w[:, 16:])
    out = reference.mla_mha_prefill(q_nope, q_pe, cache, table, cu, seq_lens, kv_b, scale)
    torch.testing.assert_close(out, absorbed, rtol=1e-5, atol=1e-6)  # both compute in fp32


def test_public_entry_point(monkeypatch):
    case = make_case(9, 16, 4, [4, 6], [3, 0])
    ref = fp32_reference(*case)
    assert_close(kernels.mla_mha_prefill(*case), ref)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert_close(kernels.mla_mha_prefill(*case), ref)
