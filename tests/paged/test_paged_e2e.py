"""End to end: a workload with `stacks: [hf, paged]` through the harness's item runner (fresh worker
process per item, collectors, baselines, verdict), as `pytest --memcheck` runs it."""
import os

from memcheck.runner import Settings, run_item
from paged_helpers import make_workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hf_and_paged_items_run_and_write_baselines(tmp_path):
    wl = make_workload(tmp_path, name="paged-e2e", requests=[
        {"count": 2, "prompt_tokens": 20, "max_new_tokens": 6},
        {"count": 1, "prompt_tokens": 9, "max_new_tokens": 4, "arrival_step": 2},
    ], engine={"block_size": 8, "max_num_batched_tokens": 16})
    settings = Settings(baselines=str(tmp_path / "baselines"), device="cpu", rootdir=ROOT, update_baselines=True)
    results = {stack: run_item(wl, stack, settings) for stack in wl.stacks}
    for stack, r in results.items():
        assert r.verdict == "new", f"{stack}: {r.verdict}: {r.reason}"
        assert r.baseline_path and os.path.exists(r.baseline_path)
    m = results["paged"].measurement
    assert m.metrics["kv.blocks_unreclaimed"].value == 0
    assert m.metrics["kv.bytes.peak"].value > 0 and m.metrics["kv.page_footprint"].value >= 1
    assert m.metrics["cpu.heap_alloc.peak"].value > m.floors["weights"]
    assert m.floors["workspace"] > 0 and m.floors["kv"] > 0
    assert any("declared activation workspace" in n for n in m.notes)
    assert any(p.get("kv.bytes") for p in m.timeline)
