"""benchmarks/engine_phases.py (the vl_phases section of benchmarks/paged_h200.py): every tower call and engine step
lands in one phase with the tokens it carried, the wrapping changes no token, and the stack is left as it was.
No time is asserted (the CPU here is shared)."""
import torch

from benchmarks.engine_phases import PHASES, EnginePhases
from memcheck.stacks.paged import PagedStack
from paged_helpers import Probe, make_workload
from test_paged_images import REQUESTS, VL


def test_every_step_and_tower_call_lands_in_one_phase(tmp_path):
    # a 24-token budget: the prefills are chunked, so steps mix decode rows and prefill chunks
    wl = make_workload(tmp_path, "deepseek-vl-7b", VL, REQUESTS, {"block_size": 8, "max_num_batched_tokens": 24})
    stack = PagedStack(wl, torch.device("cpu"))
    stack.prepare()
    try:
        plain = stack.run(Probe())
        phases = EnginePhases("cpu")
        with phases.patched(stack):
            phased = stack.run(Probe())
        steps = stack.engine.steps
        unpatched = [name for obj, name in ((stack.engine, "generate"), (stack.engine.runner, "step"),
                                            (stack.vision, "encode"), (stack.vision.model, "get_image_features"))
                     if name in vars(obj)]
    finally:
        stack.close()
    assert phased.outputs == plain.outputs
    assert unpatched == []
    got = phases.summary()
    requests = wl.request_list()
    assert got["vision"]["calls"] == sum(1 for r in requests if r.images)  # one call per image request
    assert got["vision"]["images"] == sum(r.images for r in requests) == 4
    assert got["vision"]["tokens"] == 4 * wl.image_tokens
    stepped = ("prefill", "decode_graphs", "decode_eager")
    assert sum(got[p]["calls"] for p in stepped) == steps
    fed = sum(r.images * wl.image_tokens + r.prompt_tokens + r.max_new_tokens - 1 for r in requests)
    assert sum(got[p]["tokens"] for p in stepped) == fed  # every token fed once: the last one sampled is not fed
    assert got["decode_graphs"]["calls"] == 0 and got["prefill"]["calls"] > 0 and got["decode_eager"]["calls"] > 0
    assert got["wall"] == phases.walls[-1] and len(phases.walls) == 1
    assert all(got[p]["seconds"] >= 0 for p in PHASES)
    assert got["vision"]["tower_calls"] == 4  # one image at a time
    assert 0 < got["vision"]["towers_forward_seconds"] <= got["vision"]["seconds"]
