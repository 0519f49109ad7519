"""Greedy decoding through `paged` gives the tokens `hf` gives, on the same preset and seed (float32, CPU),
for every request of a mixed batch: different prompt lengths, arrival steps, chunked prefill."""
import pytest
import torch

from harness.stacks.hf import HFStack
from harness.stacks.paged import PagedStack
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


def test_mla_prefill_runs_decompressed_and_absorbed_past_the_cap(tmp_path, monkeypatch):
    """MLA prefill rows run decompressed while the step's keys and values fit DECOMPRESS_MAX_BYTES, absorbed past it
    (a cap of 0 bytes): every step's prefill takes the path the cap says, and both give the same tokens."""
    import kernels
    from harness.stacks.paged import mla

    calls = {"decompressed": 0, "absorbed": 0}

    def counted(name, impl):
        def call(*args, **kwargs):
            calls[name] += 1
            return impl(*args, **kwargs)
        return call

    monkeypatch.setattr(kernels, "mla_mha_prefill", counted("decompressed", kernels.mla_mha_prefill))
    monkeypatch.setattr(kernels, "mla_prefill", counted("absorbed", kernels.mla_prefill))
    wl = make_workload(tmp_path, "deepseek-v2-lite", stack_names=("paged",))
    decompressed, _ = run_stack(PagedStack, wl)
    assert calls["decompressed"] > 0 and calls["absorbed"] == 0
    monkeypatch.setattr(mla, "DECOMPRESS_MAX_BYTES", 0)
    absorbed, _ = run_stack(PagedStack, wl)
    assert calls["absorbed"] == calls["decompressed"]  # the same prefill steps, now every one absorbed
    assert absorbed.outputs == decompressed.outputs
