"""The config.json files of the families users run (configs/README.md names each one's repository), loaded
through the workload loader, scaled down by overrides, built and run for a few tokens through `hf`, and through
`paged` where it implements the layout (same tokens as `hf`). Overrides keep every per-layer and per-frequency
list consistent with the fields they change."""
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from memcheck import stacks
from memcheck import transformers_compat as compat
from memcheck.errors import SoftwareUnsupported, StackUnavailable, UsageError
from memcheck.models import hf_config
from memcheck.stacks.hf import HFStack
from memcheck.stacks.paged import PagedStack
from memcheck.stacks.paged.stack import MLA_WEIGHTS_SINCE
from memcheck.stacks.paged.config import IMPLEMENTED
from memcheck.workload import load_file

sys.path.insert(0, str(Path(__file__).parents[1] / "paged"))
from paged_helpers import Probe  # noqa: E402

CONFIGS = Path(__file__).parent / "configs"
torch.set_num_threads(min(2, torch.get_num_threads()))

SMALL = dict(layers=2, hidden_size=64, intermediate_size=128, heads=4, kv_heads=2, vocab_size=512)
# Per family: what else scales it down (None: the config has no such field under that name).
FAMILIES = {
    "llama-3.1-8b.json": {},
    "llama-3.2-1b.json": dict(head_dim=16),
    "mistral-7b-v0.3.json": {},
    "qwen2.5-7b-instruct.json": {},
    "qwen3-0.6b.json": dict(head_dim=16),
    "qwen3-30b-a3b.json": dict(head_dim=16, experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "gemma-2-2b-it.json": dict(head_dim=16),
    "gemma-3-270m.json": dict(head_dim=16),
    "phi-3-mini-4k-instruct.json": {},
    "deepseek-v2-lite.json": dict(kv_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                  experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
    "deepseek-v3.json": dict(kv_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16, experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_group=2,
                             topk_group=1, first_k_dense_replace=1),
    "gpt-oss-20b.json": dict(head_dim=16, experts=4, num_experts_per_tok=2),
    "gpt2.json": dict(intermediate_size=None, kv_heads=None),
}
QUANTIZED = ("deepseek-v3.json", "gpt-oss-20b.json")  # fp8 / mxfp4 checkpoints: run here in the workload's dtype


def needs(*model_types):
    """Skip where this transformers predates an architecture the test's data uses."""
    missing = compat.missing_model_types(model_types)
    if missing:
        pytest.skip(f"transformers {compat.version()} does not implement {', '.join(missing)}")


def write_workload(tmp_path, config: dict, **model) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    doc = {"name": "family", "model": {"config": "config.json", "dtype": "float32", **model},
           "requests": [{"count": 2, "prompt_tokens": 9, "max_new_tokens": 4},
                        {"count": 1, "prompt_tokens": 5, "max_new_tokens": 3, "arrival_step": 1}],
           "stacks": ["hf", "paged"], "engine": {"block_size": 8, "max_num_batched_tokens": 16}}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def load(tmp_path, config: dict, **model):
    return load_file(str(write_workload(tmp_path, config, **model)), None, stacks.names(), {})[0]


def published(name: str) -> dict:
    data = json.loads((CONFIGS / name).read_text())
    if name in QUANTIZED:
        del data["quantization_config"]
    return data


def family_workload(tmp_path, name: str):
    model = {k: v for k, v in {**SMALL, **FAMILIES[name]}.items() if v is not None}
    return load(tmp_path, published(name), **model)


def run(stack_cls, wl, attention=None):
    stack = stack_cls(wl, torch.device("cpu"))
    stack_cls.check(wl, torch.device("cpu"))
    stack.attention = attention
    stack.prepare()
    try:
        return stack.run(Probe())
    finally:
        stack.close()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_builds_and_runs_scaled_down(tmp_path, name):
    architecture = json.loads((CONFIGS / name).read_text())["model_type"]
    needs(architecture)
    wl = family_workload(tmp_path, name)
    config = hf_config(wl)
    assert config.num_hidden_layers == 2 and config.vocab_size == 512
    hf = run(HFStack, wl)  # plain hf: what this transformers picks (eager where it has no SDPA path: GPT-OSS)
    assert [len(o) for o in hf.outputs] == [4, 4, 3]
    assert hf.metrics["kv.bytes.peak"].value > 0
    old_mla_layout = architecture.startswith("deepseek") and compat.version_tuple() < MLA_WEIGHTS_SINCE
    if architecture in IMPLEMENTED and old_mla_layout:  # the software's doing: with a baseline, the item fails
        with pytest.raises(SoftwareUnsupported, match=f"layout of transformers 5.0 and newer; transformers "
                                                      f"{compat.version()}"):
            PagedStack.check(wl, torch.device("cpu"))
    elif architecture in IMPLEMENTED:
        paged = run(PagedStack, wl)
        assert paged.outputs == hf.outputs
    else:
        with pytest.raises(StackUnavailable, match=f"not {architecture}"):
            PagedStack.check(wl, torch.device("cpu"))


def test_layers_override_cuts_a_per_layer_pattern_and_a_longer_model_continues_it(tmp_path):
    needs("gemma3_text", "gpt_oss")
    gemma = published("gemma-3-270m.json")
    assert len(gemma["layer_types"]) == 18
    cut = hf_config(load(tmp_path, gemma, layers=4, head_dim=16, hidden_size=64, heads=4, kv_heads=1))
    assert cut.layer_types == ["sliding_attention"] * 4
    longer = load(tmp_path, gemma, layers=24).model_config()
    assert [i for i, t in enumerate(longer["layer_types"]) if t == "full_attention"] == [5, 11, 17, 23]

    oss = load(tmp_path, published("gpt-oss-20b.json"), layers=3).model_config()
    assert oss["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]


def test_layer_index_lists_lose_the_layers_that_are_gone(tmp_path):
    needs("qwen3_moe")
    qwen = published("qwen3-30b-a3b.json") | {"mlp_only_layers": [0, 3, 40]}
    resolved = load(tmp_path, qwen, layers=4, **FAMILIES["qwen3-30b-a3b.json"]).model_config()
    assert resolved["mlp_only_layers"] == [0, 3]
    # Any list as long as the layer count is per-layer (Llama 4 / SmolLM3's no_rope_layers); token ids are not.
    tiny = json.loads((CONFIGS / "llama.json").read_text()) | {"no_rope_layers": [1, 0], "eos_token_id": [1, 2]}
    resolved = load(tmp_path, tiny, layers=3).model_config()
    assert resolved["no_rope_layers"] == [1, 0, 1] and resolved["eos_token_id"] == [1, 2]


def test_longrope_factors_follow_the_head_size(tmp_path):
    """Phi-3's longrope lists one factor per rotary frequency (head_dim / 2: 48 at the published 96): a smaller
    head gets a resampled list, as long as transformers checks it must be. The values here are a rising curve
    shaped like Phi-3-mini-128k's, not its published numbers."""
    phi = published("phi-3-mini-4k-instruct.json")
    curve = [round(1.0 + i / 16, 4) for i in range(48)]
    phi["rope_scaling"] = {"type": "longrope", "long_factor": curve, "short_factor": [1.0] * 48}
    phi["max_position_embeddings"], phi["original_max_position_embeddings"] = 131072, 4096
    wl = load(tmp_path, phi, layers=2, hidden_size=64, heads=4, intermediate_size=128, vocab_size=512)
    rope = wl.model_config()["rope_scaling"]
    assert len(rope["long_factor"]) == len(rope["short_factor"]) == 8  # head_dim 16
    assert rope["long_factor"][0] == curve[0] and rope["long_factor"][-1] == curve[-1]
    hf = run(HFStack, wl, "eager")
    assert [len(o) for o in hf.outputs] == [4, 4, 3]


@pytest.mark.parametrize("name, quantization", [("deepseek-v3.json", "fp8"), ("gpt-oss-20b.json", "mxfp4")])
def test_a_quantized_checkpoint_config_is_a_one_line_error_naming_the_file(tmp_path, name, quantization):
    needs(json.loads((CONFIGS / name).read_text())["model_type"])
    data = json.loads((CONFIGS / name).read_text())
    assert data["quantization_config"]["quant_method"] == quantization
    with pytest.raises(UsageError, match=r"w.yaml:\d+: model.config: .*config.json: quantization_config"):
        load(tmp_path, data)


def test_a_family_that_spells_fields_its_own_way_takes_the_same_overrides(tmp_path):
    gpt2 = load(tmp_path, published("gpt2.json"), layers=2, hidden_size=64, heads=4)
    config = hf_config(gpt2)
    assert (config.n_layer, config.n_embd, config.n_head) == (2, 64, 4)
    assert gpt2.preset.config["max_position_embeddings"] == 1024  # n_positions, under the name every family has


def test_the_experts_alias_sets_the_field_the_family_counts_experts_in(tmp_path):
    needs("qwen3_moe")
    qwen = published("qwen3-30b-a3b.json")
    assert load(tmp_path, qwen, experts=16).model_config()["num_experts"] == 16
    with pytest.raises(UsageError, match=r"num_experts_per_tok \(8\) exceeds num_experts \(4\)"):
        load(tmp_path, qwen, experts=4)
    with pytest.raises(UsageError, match=r"model.experts: must be an integer"):
        load(tmp_path, qwen, experts="many")


def test_an_architecture_this_transformers_lacks_is_named_with_the_version(tmp_path, monkeypatch):
    doc = {"name": "v3", "model": {"preset": "deepseek-v3", "layers": 2}, "requests": [{"prompt_tokens": 4,
                                                                                      "max_new_tokens": 2}]}
    (tmp_path / "v3.yaml").write_text(yaml.safe_dump(doc))
    wl = load_file(str(tmp_path / "v3.yaml"), None, stacks.names(), {})[0]
    monkeypatch.setattr(compat, "known_model_types", lambda: {"llama"})
    with pytest.raises(StackUnavailable, match=rf"transformers {compat.version()} does not implement deepseek_v3"):
        hf_config(wl)
    with pytest.raises(UsageError, match=rf"model_type 'qwen3' is not an architecture transformers "
                                         rf"{compat.version()} knows"):
        monkeypatch.setattr("transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES", {"llama": "x"})
        load(tmp_path, published("qwen3-0.6b.json"))
