"""MLA decode with absorbed projections (Triton, under the interpreter) against the float32
reference, and the reference against the unabsorbed multi-head form it stands for."""
import pytest
import torch

pytest.importorskip("triton")

from memcheck import kernels  # noqa: E402
from kernel_helpers import DTYPES, assert_close, poisoned, randn, scattered_block_table  # noqa: E402
from memcheck.kernels import reference  # noqa: E402
from memcheck.kernels.mla import mla_decode, mla_prefill  # noqa: E402


def make_case(seed, block_size, heads, lengths, rank=64, rope=16, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    table, num_blocks = scattered_block_table(lengths, block_size, gen)
    cache = randn(gen, num_blocks, block_size, rank + rope, dtype=dtype)
    q_latent = randn(gen, len(lengths), heads, rank, dtype=dtype)
    q_pe = randn(gen, len(lengths), heads, rope, dtype=dtype)
    return q_latent, q_pe, cache, table, torch.tensor(lengths, dtype=torch.int32), (rank // 4 + rope) ** -0.5


def fp32_reference(q_latent, q_pe, cache, table, seq_lens, scale):
    return reference.mla_decode(q_latent.float(), q_pe.float(), cache.float(), table, seq_lens, scale)


@pytest.mark.parametrize("heads", [4, 16, 20, 40])  # padded to 16; one block; 32-head block; 64-head block
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_matches_reference_fp32(block_size, heads):
    case = make_case(block_size + heads, block_size, heads, [block_size * 2 + 5, 1, 13])
    assert_close(mla_decode(*case, out=poisoned(case[0])), fp32_reference(*case))


def test_time_stamps_asked_of_the_triton_kernel_are_refused_not_left_unwritten():
    case = make_case(3, 16, 16, [40, 7])
    with pytest.raises(ValueError, match="only the Gluon decode kernels"):
        mla_decode(*case, config={"stamps": torch.zeros(8, 4, dtype=torch.int64)})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision(dtype):
    case = make_case(1, 16, 16, [29, 40], dtype=DTYPES[dtype])
    assert_close(mla_decode(*case, out=poisoned(case[0])), fp32_reference(*case))


@pytest.mark.parametrize("min_tiles", [1, 2])
@pytest.mark.parametrize("num_programs", [1, 3, 20])
def test_any_split_of_the_work_gives_the_same_answer(num_programs, min_tiles):
    case = make_case(num_programs, 8, 16, [45, 0, 3])
    out = mla_decode(*case, out=poisoned(case[0]), num_programs=num_programs, config={"min_tiles": min_tiles})
    assert_close(out, fp32_reference(*case))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("unroll_j", [0, 64], ids=["partials-as-one-tile", "partials-unrolled"])
@pytest.mark.parametrize("per_sm", [0, 1, 10**6], ids=["all-rows", "rows-halved", "least-blocks"])
@pytest.mark.parametrize("min_tiles", [1, 3])  # 20 ranges of a tile; 6 ranges of 3-4 tiles
def test_one_long_sequence_merged_from_many_partials(monkeypatch, min_tiles, per_sm, unroll_j):
    """The combine's grains as in test_kernel_decode: 16 rows in one program, halved to 4 (the CPU's 4
    multiprocessors), 2 rows and the least columns; a step's partials as one tile or unrolled. Every range lies
    inside the sequence: one partial each."""
    from memcheck.kernels import work_split

    monkeypatch.setattr(work_split, "COMBINE_PROGRAMS_PER_SM", per_sm)
    monkeypatch.setattr(work_split, "COMBINE_UNROLL_J", unroll_j)
    case = make_case(4, 16, 16, [16 * 19 + 5])  # 20 tiles of 16 tokens on the CPU, one head block
    out = mla_decode(*case, out=poisoned(case[0]), num_programs=19, config={"min_tiles": min_tiles})
    assert_close(out, fp32_reference(*case))


def test_deepseek_v2_lite_widths_bf16():
    case = make_case(2, 16, 16, [21, 7], rank=512, rope=64, dtype=torch.bfloat16)
    assert_close(mla_decode(*case, out=poisoned(case[0])), fp32_reference(*case))


def test_absorbed_reference_equals_the_unabsorbed_multi_head_form():
    """scores = q_nope.(W_UK kv_c) + q_pe.k_pe and out = softmax @ (W_UV kv_c), head by head, equal
    the absorbed reference fed q_latent = q_nope @ W_UK and followed by W_UV."""
    gen = torch.Generator().manual_seed(3)
    heads, nope, rank, rope, v_dim = 4, 8, 32, 16, 8
    _, q_pe, cache, table, seq_lens, scale = make_case(4, 8, heads, [19], rank=rank, rope=rope, dtype=torch.float64)
    q_nope = torch.randn(1, heads, nope, generator=gen, dtype=torch.float64)
    w_uk = torch.randn(heads, nope, rank, generator=gen, dtype=torch.float64)
    w_uv = torch.randn(heads, rank, v_dim, generator=gen, dtype=torch.float64)
    latent = torch.cat([cache[b] for b in table[0].tolist()])[:19]
    kv_c, k_pe = latent[:, :rank], latent[:, rank:]
    k_nope = torch.einsum("hnr,tr->htn", w_uk, kv_c)  # per-head keys the model would expand
    values = torch.einsum("hrv,tr->htv", w_uv, kv_c)
    scores = (torch.einsum("hn,htn->ht", q_nope[0], k_nope) + torch.einsum("hp,tp->ht", q_pe[0], k_pe)) * scale
    expanded = torch.einsum("ht,htv->hv", scores.softmax(-1), values)
    q_latent = torch.einsum("shn,hnr->shr", q_nope, w_uk)
    absorbed = reference.mla_decode(q_latent, q_pe, cache, table, seq_lens, scale)
    torch.testing.assert_close(torch.einsum("hr,hrv->hv", absorbed[0], w_uv), expanded, rtol=1e-4, atol=1e-5)


def test_public_entry_point(monkeypatch):
    case = make_case(9, 16, 16, [30, 2])
    ref = fp32_reference(*case)
    assert_close(kernels.mla_decode(*case), ref)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert_close(kernels.mla_decode(*case), ref)


def make_prefill_case(seed, block_size, heads, q_lens, prefixes, rank=64, rope=16, dtype=torch.float32):
    """Packed new tokens of several sequences, each after a cached prefix of its own."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [p + n for p, n in zip(prefixes, q_lens)]
    table, num_blocks = scattered_block_table(lengths, block_size, gen)
    cache = randn(gen, num_blocks, block_size, rank + rope, dtype=dtype)
    total = sum(q_lens)
    cu = torch.tensor([0] + [sum(q_lens[:i + 1]) for i in range(len(q_lens))], dtype=torch.int32)
    return (randn(gen, total, heads, rank, dtype=dtype), randn(gen, total, heads, rope, dtype=dtype), cache, table,
            cu, torch.tensor(lengths, dtype=torch.int32), (rank // 4 + rope) ** -0.5)


def prefill_fp32_reference(q_latent, q_pe, cache, table, cu, seq_lens, scale):
    return reference.mla_prefill(q_latent.float(), q_pe.float(), cache.float(), table, cu, seq_lens, scale)


@pytest.mark.parametrize("heads", [4, 16, 20])
@pytest.mark.parametrize("block_size", [8, 16])
def test_prefill_matches_reference_fp32(block_size, heads):
    """Plain prefill (no prefix), chunked prefill (new tokens after a cached prefix) and a one-token
    chunk, packed in one launch."""
    case = make_prefill_case(block_size + heads, block_size, heads, [9, 5, 1], [0, 2 * block_size + 3, 11])
    assert_close(mla_prefill(*case, out=poisoned(case[0])), prefill_fp32_reference(*case))


def test_prefill_bf16_deepseek_v2_lite_widths():
    case = make_prefill_case(5, 16, 16, [7, 3], [0, 20], rank=512, rope=64, dtype=torch.bfloat16)
    assert_close(mla_prefill(*case, out=poisoned(case[0])), prefill_fp32_reference(*case))


def test_prefill_rows_are_causal_and_equal_decode_one_token_at_a_time():
    """The reference prefill of n new tokens equals n decode steps, each over the tokens up to its own."""
    q_latent, q_pe, cache, table, cu, seq_lens, scale = make_prefill_case(7, 8, 4, [6], [10])
    prefill = reference.mla_prefill(q_latent, q_pe, cache, table, cu, seq_lens, scale)
    for i in range(6):
        step = reference.mla_decode(q_latent[i:i + 1], q_pe[i:i + 1], cache, table, torch.tensor([11 + i]), scale)
        torch.testing.assert_close(prefill[i], step[0], rtol=1e-5, atol=1e-6)  # both float32 inside


def test_prefill_public_entry_point(monkeypatch):
    case = make_prefill_case(9, 16, 16, [4, 6], [3, 0])
    ref = prefill_fp32_reference(*case)
    assert_close(kernels.mla_prefill(*case), ref)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert_close(kernels.mla_prefill(*case), ref)


def test_the_hopper_kernel_takes_only_its_own_tiles_where_it_runs(monkeypatch):
    """memcheck/kernels/mla_seesaw.py (Gluon, sm_90) runs a call only when the config asks for it with its 64-head blocks of
    64-token tiles, on a GPU and shapes it supports, and never where Triton has no Gluon to import."""
    from memcheck.kernels import mla

    q, q_pe, cache = torch.zeros(1, 128, 512), torch.zeros(1, 128, 64), torch.zeros(1, 16, 576)
    assert not mla._hopper_takes(mla.MANY_HEADS_CONFIG, q, q_pe, cache, 128)  # a CPU tensor
    monkeypatch.setattr(mla.mla_seesaw, "supported", lambda *args: True)
    assert mla._hopper_takes(mla.MANY_HEADS_CONFIG, q, q_pe, cache, 128)
    for other in ({"hopper": False}, {"head_block": 32}, {"block_n": 32}):
        assert not mla._hopper_takes({**mla.MANY_HEADS_CONFIG, **other}, q, q_pe, cache, 128), other
    assert not mla._hopper_takes(mla.DEFAULT_CONFIG, q, q_pe, cache, 16)
    # 16 heads (V2-Lite) and 32 (V2/V3 over 4 ranks): the seesaw's 64-head block, masked, where it runs; Triton's
    # 16- and 32-head blocks elsewhere
    for heads in (16, 32):
        assert mla._hopper_takes(mla.decode_config(heads, hopper=True), q, q_pe, cache, heads)
    # where mla_narrow runs, its heads as N up to 16 heads (the seesaw's tiles where it does not), the seesaw above
    assert [mla.decode_config(h, hopper=True).get("narrow", False) for h in (8, 16, 17, 32, 64)] == [
        True, True, False, False, False]
    assert mla.decode_config(16) is mla.DEFAULT_CONFIG and mla.decode_config(32) is mla.MID_HEADS_CONFIG
    assert mla.decode_config(128) is mla.MANY_HEADS_CONFIG
    monkeypatch.setattr(mla, "mla_seesaw", None)
    assert not mla._hopper_takes(mla.MANY_HEADS_CONFIG, q, q_pe, cache, 128)
