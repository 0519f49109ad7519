"""Any model by its config.json: users gate their own architectures, not only the presets. The configs in
configs/ are tiny config.json files shaped like those of Llama 3, Mistral and Phi-3 repositories."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from memcheck import stacks
from memcheck.errors import StackUnavailable, UsageError
from memcheck.models import hf_config
from memcheck.stacks.hf import HFStack
from memcheck.stacks.paged import PagedStack
from memcheck.workload import load_file

sys.path.insert(0, str(Path(__file__).parents[1] / "paged"))
from paged_helpers import run_stack  # noqa: E402

CONFIGS = Path(__file__).parent / "configs"
torch.set_num_threads(min(2, torch.get_num_threads()))


def config_workload(tmp_path, config="llama.json", name="mine", **model):
    """A workload on one of configs/ (copied beside it, named relative to it), for the hf and paged stacks."""
    if not (tmp_path / config).exists():
        shutil.copy(CONFIGS / config, tmp_path / config)
    doc = {"name": name, "model": {"config": config, "dtype": "float32", **model},
           "requests": [{"count": 2, "prompt_tokens": 21, "max_new_tokens": 12},
                        {"count": 1, "prompt_tokens": 5, "max_new_tokens": 16, "arrival_step": 2}],
           "stacks": ["hf", "paged"], "engine": {"block_size": 8, "max_num_batched_tokens": 16}}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_file(str(tmp_path / "w.yaml"), None, stacks.names(), {})[0]


def test_config_is_read_relative_to_the_workload_and_identifies_the_model(tmp_path):
    wl = config_workload(tmp_path)
    assert wl.preset.identity == {"config": "llama.json", "model_type": "llama",
                                  "config_digest": wl.preset.config_digest}
    assert not wl.scaled
    config = hf_config(wl)
    assert type(config).__name__ == "LlamaConfig" and config.num_key_value_heads == 1
    rope = getattr(config, "rope_parameters", None) or config.rope_scaling  # transformers 5 / 4
    assert rope["rope_type"] == "llama3"  # the architecture as published, scaling included

    # The workload digest follows the config's content: another config is another workload.
    before = wl.digest()
    data = json.loads((tmp_path / "llama.json").read_text())
    data["intermediate_size"] = 96
    (tmp_path / "llama.json").write_text(json.dumps(data))
    changed = load_file(str(tmp_path / "w.yaml"), None, stacks.names(), {})[0]
    assert changed.digest() != before and changed.preset.config_digest != wl.preset.config_digest


def test_overrides_scale_a_config_as_a_preset(tmp_path):
    wl = config_workload(tmp_path, "phi3.json", layers=1, vocab_size=128)
    assert wl.scaled and wl.overrides == {"layers": 1, "vocab_size": 128}
    config = hf_config(wl)
    assert config.num_hidden_layers == 1 and config.vocab_size == 128
    assert config.eos_token_id is None  # 32000 is no token of a 128-token vocabulary


@pytest.mark.parametrize("model, message", [
    ({"config": "absent.json"}, r"w.yaml:\d+: model.config: cannot read .*absent.json"),
    ({"config": "llama.json", "preset": "deepseek-v3"}, r"model.config: give a preset or a config, not both"),
    ({"config": "notype.json"}, r"model.config: .*notype.json: has no model_type"),
    ({"config": "alien.json"}, r"model.config: .*alien.json: model_type 'alien' is not an architecture"),
    ({"config": "llama.json", "kv_lora_rank": 4},
     r"model.kv_lora_rank: not an architecture field of config 'llama.json'"),
])
def test_bad_configs_are_one_line_errors_naming_the_field(tmp_path, model, message):
    (tmp_path / "notype.json").write_text('{"hidden_size": 8}')
    (tmp_path / "alien.json").write_text('{"model_type": "alien"}')
    shutil.copy(CONFIGS / "llama.json", tmp_path / "llama.json")
    doc = {"name": "bad", "model": model, "requests": [{"prompt_tokens": 4, "max_new_tokens": 2}]}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match=message):
        load_file(str(tmp_path / "w.yaml"), None, stacks.names(), {})


@pytest.mark.parametrize("config", ["llama.json", "mistral.json"])
def test_paged_gives_hf_tokens_on_a_users_config(tmp_path, config):
    wl = config_workload(tmp_path, config)
    PagedStack.check(wl, "cpu")
    hf, _ = run_stack(HFStack, wl)
    paged, _ = run_stack(PagedStack, wl)
    assert paged.outputs == hf.outputs
    assert paged.metrics["kv.blocks_unreclaimed"].value == 0


def test_paged_skips_architectures_it_does_not_implement(tmp_path):
    with pytest.raises(StackUnavailable, match="the paged stack implements the llama, .* not phi3"):
        PagedStack.check(config_workload(tmp_path, "phi3.json"), "cpu")
    data = json.loads((CONFIGS / "mistral.json").read_text())
    data["sliding_window"] = 16
    (tmp_path / "windowed.json").write_text(json.dumps(data))
    with pytest.raises(StackUnavailable, match=r"sliding-window attention \(sliding_window 16 < 33 tokens"):
        PagedStack.check(config_workload(tmp_path, "windowed.json"), "cpu")
