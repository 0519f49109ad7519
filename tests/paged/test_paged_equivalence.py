"""Greedy decoding through `paged` gives the tokens `hf` gives, on the same preset and seed (float32, CPU),
for every request of a mixed batch: different prompt lengths, arrival steps, chunked prefill."""
import pytest
import torch

from memcheck.stacks.hf import HFStack
from memcheck.stacks.paged import PagedStack
from paged_helpers import FAMILIES, run_stack, make_workload

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="module", params=list(FAMILIES))
def both(request, tmp_path_factory):
    wl = make_workload(tmp_path_factory.mktemp("wl"), request.param)
    hf, _ = run_stack(HFStack, wl)
    paged, probe = run_stack(PagedStack, wl)
    return wl, hf, paged, probe


def test_same_first_16_tokens_as_hf(both):
    wl, hf, paged, _ = both
    assert len(paged.outputs) == len(hf.outputs) == sum(g.count for g in wl.requests)
    for i, (want, got) in enumerate(zip(hf.outputs, paged.outputs)):
        assert len(got) == wl.request_list()[i].max_new_tokens
        assert got[:16] == want[:16], f"request {i}"


def test_blocks_reclaimed_and_kv_metrics_consistent(both):
    wl, _, paged, probe = both
    m = {k: v.value for k, v in paged.metrics.items()}
    assert m["kv.blocks_unreclaimed"] == 0
    assert 0 < m["kv.live_bytes.peak"] <= m["kv.bytes.peak"]
    assert 0 <= m["kv.waste.peak"] < 1
    assert m["kv.page_footprint"] >= 1
    assert m["tokens_per_s"] > 0 and m["ttft"] > 0 and m["tpot"] > 0
    assert probe.points[-1][1]["kv.bytes"] == 0  # the last step handed every block back
    steps = [n for n, _ in probe.points]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert any("declared activation workspace" in n for n in paged.notes)


def test_mla_prefill_decompressed_and_absorbed_give_the_same_tokens(tmp_path, monkeypatch):
    """MLA prefill rows run decompressed (kernels.mla_mha_prefill) or absorbed (kernels.mla_prefill), as
    runs_decompressed weighs them: forced one way, then the other, every prefill step takes that path, and the
    tokens are the same."""
    from memcheck import kernels
    from memcheck.stacks.paged import mla

    calls = {"decompressed": 0, "absorbed": 0}

    def counted(name, impl):
        def call(*args, **kwargs):
            calls[name] += 1
            return impl(*args, **kwargs)
        return call

    monkeypatch.setattr(kernels, "mla_mha_prefill", counted("decompressed", kernels.mla_mha_prefill))
    monkeypatch.setattr(kernels, "mla_prefill", counted("absorbed", kernels.mla_prefill))
    wl = make_workload(tmp_path, "deepseek-v2-lite", stack_names=("paged",))
    monkeypatch.setattr(mla, "ABSORBED_SLOWDOWN", float("inf"))
    decompressed, _ = run_stack(PagedStack, wl)
    assert calls["decompressed"] > 0 and calls["absorbed"] == 0
    monkeypatch.setattr(mla, "ABSORBED_SLOWDOWN", 0.0)
    absorbed, _ = run_stack(PagedStack, wl)
    assert calls["absorbed"] == calls["decompressed"]  # the same prefill steps, now every one absorbed
    assert absorbed.outputs == decompressed.outputs


@pytest.mark.parametrize("new, prefix, decompressed", [
    (8192, 0, True),  # a prompt
    (2048, 30720, True),  # a chunk of a long prompt
    (16, 100_000, False),  # a few tokens on a long prefix: decompressing 100K tokens costs more than attending
    (64, 0, False),  # a short prompt: kv_b_proj over its context outweighs what the narrower scores save
])
def test_runs_decompressed_weighs_decompression_against_the_absorbed_form(new, prefix, decompressed):
    from memcheck.stacks.paged.context import StepContext
    from memcheck.stacks.paged.mla import runs_decompressed

    ctx = StepContext(torch.zeros(new), torch.zeros(new), 0, prefill_context_tokens=prefix + new,
                      prefill_pairs=new * prefix + new * (new + 1) // 2)
    assert runs_decompressed(ctx, rank=512, nope=128, rope=64, v_dim=128) is decompressed  # DeepSeek-V2's widths


@pytest.mark.parametrize("family, forms", [("deepseek-v2-lite", ["decompressed", "absorbed"]),
                                           ("r1-distill-qwen-7b", [])])
def test_the_prefill_warm_up_compiles_both_forms_of_mla_prefill(tmp_path, monkeypatch, family, forms):
    """A step may run MLA prefill in either form: the warm-up (before the timed run) makes a pass in each, so neither
    kernel compiles inside a timed step (on the H200, the absorbed one at 128 heads did: v2-4layers 1,622 -> 217
    tokens/s). A dense model makes one pass."""
    from memcheck import kernels

    wl = make_workload(tmp_path, family, stack_names=("paged",))
    stack = PagedStack(wl, torch.device("cpu"))
    stack.prepare()
    try:
        ran = []
        monkeypatch.setattr(kernels, "mla_mha_prefill", lambda *a, **k: ran.append(("decompressed", len(a[0]))))
        monkeypatch.setattr(kernels, "mla_prefill", lambda *a, **k: ran.append(("absorbed", len(a[0]))))
        stack.engine.runner.warm_prefill(40, stack.cfg.block_size)
    finally:
        stack.close()
    layers = FAMILIES[family]["layers"]
    # the absorbed pass small: it runs inside the memory metrics' window, and compiles the same at any size
    assert ran == [(form, tokens) for form, tokens in zip(forms, (40, 16)) for _ in range(layers)]
