"""Tensor parallelism on the CPU: the paged stack over 2 gloo ranks (one worker process per rank) through
the harness's item runner, against tensor_parallel 1; per-rank numbers in the JSON and Markdown reports;
a rank that dies gives an `error` verdict and the session goes on."""
import dataclasses
import json
import os

import pytest
import torch
import yaml

from memcheck import project, stacks, workload
from memcheck.errors import StackUnavailable
from memcheck.floors import kv_floor
from memcheck.measurement import Measurement
from memcheck.metrics.value import MetricValue
from memcheck.reports import markdown
from memcheck.reports.report import Report
from memcheck.runner import Settings, run_item
from memcheck.stacks.paged import PagedStack
from memcheck.stacks.paged.tensor_parallel import outputs_digest
from memcheck.rank_workers import FAULT_ENV, merge
from tests.paged.paged_helpers import FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DENSE = dict(layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=512)
REQUESTS = [{"count": 2, "prompt_tokens": 20, "max_new_tokens": 6},
            {"count": 1, "prompt_tokens": 9, "max_new_tokens": 4, "arrival_step": 2}]
ENGINE = {"block_size": 8, "max_num_batched_tokens": 16}
V2 = dict(layers=2, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
          kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
          num_experts_per_tok=2, vocab_size=512)


def make(tmp_path, name, tp, preset="r1-distill-qwen-7b", arch=None, stack_names=("hf", "paged")):
    doc = {"name": name, "model": {"preset": preset, "dtype": "float32", **(arch or DENSE)}, "requests": REQUESTS,
           "stacks": list(stack_names), "engine": ENGINE, "tensor_parallel": tp}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return workload.load_file(str(path), None, stacks.names(), project.load(tmp_path).thresholds)[0]


def settings(tmp_path):
    return Settings(baselines=str(tmp_path / "baselines"), device="cpu", rootdir=ROOT, update_baselines=True)


def tp1_run(wl):
    stack = PagedStack(wl, torch.device("cpu"))
    PagedStack.check(wl, torch.device("cpu"))
    stack.prepare()

    class Probe:
        def step(self, *_, **__):
            pass

    try:
        return stack.run(Probe())
    finally:
        stack.close()


def test_tp2_paged_matches_tp1_with_per_rank_numbers_in_the_reports(tmp_path):
    tp1 = tp1_run(make(tmp_path, "tp-dense-1", 1))
    result = run_item(make(tmp_path, "tp-dense", 2), "paged", settings(tmp_path))
    assert result.verdict == "new", result.reason
    m = result.measurement
    print("tp1 kv.bytes.peak", tp1.metrics["kv.bytes.peak"].value, "ranks", json.dumps(m.ranks))
    # Greedy tokens equal to tensor_parallel 1 (float32): the ranks sample from all-gathered logits.
    assert f"greedy outputs sha256 {outputs_digest(tp1.outputs)}" in " ".join(m.notes)
    # Each rank's KV pool holds half the KV heads: half of tensor_parallel 1's KV bytes, per rank.
    assert [r["rank"] for r in m.ranks] == [0, 1]
    kv1 = tp1.metrics["kv.bytes.peak"].value
    for rank in m.ranks:
        assert rank["metrics"]["kv.bytes.peak"] * 2 == kv1
        assert rank["metrics"]["kv.live_bytes.peak"] * 2 == tp1.metrics["kv.live_bytes.peak"].value
        assert rank["metrics"]["kv.blocks_unreclaimed"] == 0
        # null when the memory round failed: its reason (which rank, why) is the item's metric's
        assert (rank["metrics"]["cpu.heap_alloc.peak"] or 0) > 0, m.metrics["cpu.heap_alloc.peak"].reason
    assert m.ranks[0]["metrics"]["host.page_faults"] != m.ranks[1]["metrics"]["host.page_faults"] or \
        m.ranks[0]["metrics"]["host.rss.peak"] != m.ranks[1]["metrics"]["host.rss.peak"]  # each rank its own
    for name in ("kv.bytes.peak", "cpu.heap_alloc.peak", "host.rss.peak", "time.wall"):
        assert m.metrics[name].value == max(r["metrics"][name] for r in m.ranks)
    assert m.floors["kv"] * 2 <= tp1.metrics["kv.bytes.peak"].value
    # The baseline keeps the per-rank numbers beside the merged metrics (the rules compare the merged ones).
    assert json.loads(open(result.baseline_path).read())["ranks"] == m.ranks
    # The JSON report carries the ranks, and reads back; the Markdown report shows the per-rank table.
    report = Report([result])
    path = tmp_path / "report.json"
    report.write_json(str(path))
    data = json.loads(path.read_text())
    assert data["items"][0]["ranks"] == m.ranks
    assert Report.load(str(path)).items[0].measurement.ranks == m.ranks
    md = markdown.render(report)
    assert "Per rank (2 tensor-parallel ranks" in md
    assert "| rank | `kv.bytes.peak` |" in md
    rows = [line for line in md.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert len(rows) == 2
    assert all(row.split("|")[2].strip() == markdown._value(kv1 // 2, "kv.bytes.peak") for row in rows)


@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v3"])
def test_tp2_mla_and_moe_give_tp1_greedy_tokens(tmp_path, preset):
    """MLA heads and every expert's intermediate dimension split over 2 gloo ranks, the latent cache and the
    router whole on each: V2-Lite (greedy softmax routing, shared experts) and V3 (q LoRA, noaux_tc routing
    over groups, a dense first layer)."""
    arch = FAMILIES[preset]
    tp1 = tp1_run(make(tmp_path, f"tp-{preset}-1", 1, preset, arch))
    wl = make(tmp_path, f"tp-{preset}", 2, preset, arch)
    timed_only = dataclasses.replace(settings(tmp_path), python_heap=False, cpu_tensors=False)  # no memory round
    result = run_item(wl, "paged", timed_only)
    assert result.verdict == "new", result.reason
    m = result.measurement
    notes = " ".join(m.notes)
    assert f"greedy outputs sha256 {outputs_digest(tp1.outputs)}" in notes
    assert "kv_a_proj_with_mqa" in notes and "mlp.gate.weight" in notes  # what stays whole, named
    for rank in m.ranks:  # the latent cache is whole on every rank
        assert rank["metrics"]["kv.bytes.peak"] == tp1.metrics["kv.bytes.peak"].value
    assert m.floors["kv"] == kv_floor(wl, 4)  # float32: the whole latent's floor, not divided


def test_a_rank_that_dies_gives_an_error_and_the_session_goes_on(tmp_path, monkeypatch):
    wl = make(tmp_path, "tp-crash", 2)
    monkeypatch.setenv(FAULT_ENV, "1")
    crashed = run_item(wl, "paged", settings(tmp_path))
    monkeypatch.delenv(FAULT_ENV)
    assert crashed.verdict == "error"
    assert "rank 1" in crashed.reason and "SIGKILL" in crashed.reason, crashed.reason
    print("error reason:", crashed.reason)
    # The next item runs. A model the paged stack cannot shard: every rank skips before joining the group.
    odd = make(tmp_path, "tp-odd", 2, "r1-distill-qwen-7b", dict(DENSE, num_key_value_heads=1))
    skipped = run_item(odd, "paged", settings(tmp_path))
    assert skipped.verdict == "skipped" and "not divisible" in skipped.reason, skipped.reason


@pytest.mark.parametrize("preset,arch,what", [
    ("deepseek-v2-lite", dict(V2, moe_intermediate_size=33), "moe_intermediate_size"),
    ("deepseek-v2-lite", dict(V2, hidden_size=48, num_attention_heads=3, num_key_value_heads=3), "num_attention_heads"),
    ("r1-distill-qwen-7b", dict(DENSE, num_key_value_heads=1), "num_key_value_heads"),
])
def test_models_that_do_not_shard_are_unavailable_with_a_reason(tmp_path, preset, arch, what):
    wl = make(tmp_path, "tp-no", 2, preset, arch)
    with pytest.raises(StackUnavailable, match=f"{what} .* not divisible"):
        PagedStack.check(wl, torch.device("cpu"))


def test_merge_takes_the_maximum_and_keeps_each_rank():
    ranks = []
    for r, (kv, wall) in enumerate([(100, 2.0), (300, 1.0)]):
        m = Measurement("w", "paged", floors={"kv": 10 + r})
        m.metrics = {"kv.bytes.peak": MetricValue(kv), "time.wall": MetricValue(wall),
                     "gpu.ooms": MetricValue.null("no CUDA device on this runner")}
        ranks.append(m)
    m = merge(ranks)
    assert m.metrics["kv.bytes.peak"].value == 300 and m.metrics["time.wall"].value == 2.0
    assert m.metrics["gpu.ooms"].value is None and m.metrics["gpu.ooms"].reason
    assert m.floors == {"kv": 11}
    assert m.ranks[0] == {"rank": 0, "metrics": {"gpu.ooms": None, "kv.bytes.peak": 100, "time.wall": 2.0}}
    assert m.ranks[1] == {"rank": 1, "metrics": {"gpu.ooms": None, "kv.bytes.peak": 300, "time.wall": 1.0}}
    assert "ranks" in m.to_json()
    assert m.environment.get("device_class") is None  # no class given, none made up


def test_a_gpu_items_device_class_names_its_gpu_count():
    ranks = []
    for gpu in ("NVIDIA H200", None):
        pair = [Measurement("w", "paged") for _ in range(2)]
        for m in pair:
            m.environment = {"device_class": "nvidia-h200" if gpu else "cpu-x86_64", "gpu": gpu}
        ranks.append(merge(pair).environment["device_class"])
    assert ranks == ["nvidia-h200-x2", "cpu-x86_64"]


def test_tensor_parallel_1_json_has_no_ranks():
    assert "ranks" not in Measurement("w", "paged").to_json()


def test_hf_is_skipped_at_tensor_parallel_2(tmp_path):
    from memcheck.stacks.hf import HFStack

    with pytest.raises(StackUnavailable, match="one device; tensor_parallel 2"):
        HFStack.check(make(tmp_path, "tp-hf", 2), torch.device("cpu"))
