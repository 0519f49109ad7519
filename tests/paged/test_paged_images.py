"""DeepSeek-VL image requests through `paged`: the towers are the transformers modules, each image's
features replace its placeholders (chunked prefill may split them across passes), and greedy
tokens match `hf` for a mixed batch of text-only and 1- and 2-image requests arriving at different steps."""
import pytest
import torch

from memcheck import models
from memcheck.stacks.hf import HFStack
from memcheck.stacks.paged import PagedStack
from memcheck.stacks.paged.vision import VisionEncoder
from paged_helpers import make_workload, run_stack

pytestmark = pytest.mark.skipif(not hasattr(models, "image_pixels"),
                                reason="this checkout's harness has no seeded image inputs")

VL = dict(layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
          vocab_size=2048,
          vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=64),
          high_res_vision=dict(hidden_size=32, mlp_dim=64, num_hidden_layers=2, num_attention_heads=2,
                               global_attn_indexes=[1], image_size=128))
REQUESTS = [
    {"count": 1, "prompt_tokens": 20, "max_new_tokens": 16},
    {"count": 1, "prompt_tokens": 9, "max_new_tokens": 16, "images": 1},
    {"count": 1, "prompt_tokens": 30, "max_new_tokens": 16, "images": 2, "arrival_step": 2},
    {"count": 1, "prompt_tokens": 5, "max_new_tokens": 16, "images": 1, "arrival_step": 2},
]


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    # a 24-token budget splits the 2-image request's 32 placeholders across prefill chunks
    return make_workload(tmp_path_factory.mktemp("vl"), "deepseek-vl-7b", VL, REQUESTS,
                         {"block_size": 8, "max_num_batched_tokens": 24})


@pytest.fixture(scope="module")
def paged(workload):
    return run_stack(PagedStack, workload)[0]


def test_image_requests_match_hf(workload, paged):
    hf, _ = run_stack(HFStack, workload)
    assert paged.outputs == hf.outputs
    assert paged.metrics["kv.blocks_unreclaimed"].value == 0
    assert any("4 images through the DeepSeek-VL towers" in n for n in paged.notes)
    assert any("vision towers (one image at a time)" in n for n in paged.notes)


def test_image_features_reach_the_model(workload, paged, monkeypatch):
    reference = paged
    original = VisionEncoder.encode
    monkeypatch.setattr(VisionEncoder, "encode", lambda self, source: torch.zeros_like(original(self, source)))
    blind, _ = run_stack(PagedStack, workload)
    assert blind.outputs[0] == reference.outputs[0]  # the text-only request does not see images
    assert any(blind.outputs[i] != reference.outputs[i] for i in (1, 2, 3))


def _tower_calls(stack, monkeypatch) -> list:
    """Record (low-res shape, high-res shape, dtype) of every image the towers are asked to encode."""
    calls, original = [], stack.vision.model.get_image_features

    def spy(pixel_values, high_res_pixel_values, **kwargs):
        calls.append((tuple(pixel_values.shape), tuple(high_res_pixel_values.shape), pixel_values.dtype))
        return original(pixel_values, high_res_pixel_values, **kwargs)

    monkeypatch.setattr(stack.vision.model, "get_image_features", spy)
    return calls


def test_the_warmup_sends_one_image_of_the_runs_shape_through_the_towers_on_cuda_only(workload, paged, monkeypatch):
    from paged_helpers import Probe

    stack = PagedStack(workload, torch.device("cpu"))
    stack.prepare()
    calls = _tower_calls(stack, monkeypatch)
    stack.warmup()
    assert calls == []  # on the CPU the warm-up does nothing (a first run is no slower there)
    monkeypatch.setattr(PagedStack, "on_cuda", lambda self: True)
    stack.warmup()
    assert len(calls) == 1 and calls[0][0][0] == 1 and calls[0][2] == stack.dtype
    warm = calls[0]
    try:
        result = stack.run(Probe())
    finally:
        stack.close()
    assert calls[1:] == [warm] * 4  # the run's 4 images: one at a time, the same shapes and dtype
    assert result.outputs == paged.outputs  # the warm-up's image changes no token
    assert any("4 images through the DeepSeek-VL towers" in n for n in result.notes)  # and is not counted
