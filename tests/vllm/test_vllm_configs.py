"""The vllm stack on users' own models (a config.json of an architecture no preset has): real vLLM, judged
against a baseline like any other item."""
import shutil
from pathlib import Path

import pytest

from memcheck.runner import Settings, run_item
from memcheck.stacks.vllm import vllm_python
from memcheck.workload import load_file

CONFIGS = Path(__file__).parents[1] / "models" / "configs"
needs_vllm = pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment here: run scripts/setup-vllm "
                                                              "(CPU) or install vllm")
WORKLOAD = """
name: {name}
model: {{config: {config}}}
requests:
  - {{count: 2, prompt_tokens: 40, max_new_tokens: 8}}
engine: {{block_size: 32, enforce_eager: true}}
stacks: [vllm]
"""


def load(tmp_path, config: str):
    shutil.copy(CONFIGS / config, tmp_path / config)
    path = tmp_path / f"{config}.yaml"
    path.write_text(WORKLOAD.format(name=Path(config).stem, config=config))
    return load_file(str(path), None, {"vllm"}, {"kv.bytes.peak": _rule()})[0]


def _rule():
    from memcheck import rules

    return rules.parse("kv.bytes.peak", {"max_increase": "0%"}, None)


@needs_vllm
@pytest.mark.parametrize("config, kv_heads", [("llama.json", 1), ("phi3.json", 2)])
def test_a_users_config_runs_and_gates_through_vllm(tmp_path, config, kv_heads):
    wl = load(tmp_path, config)
    settings = Settings(baselines=str(tmp_path / "b"), rootdir=str(tmp_path), update_baselines=True)
    first = run_item(wl, "vllm", settings)
    m = first.measurement
    assert first.verdict == "new", (first.reason, m.notes)
    assert m.model == {"config": config, "model_type": wl.preset.model_type,
                       "config_digest": wl.preset.config_digest}
    token_bytes = 2 * kv_heads * 64 * 2 * 4  # layers x kv heads x head dim x (K, V) x float32
    kv = m.metrics["kv.bytes.peak"].value
    assert kv and kv % (32 * token_bytes) == 0  # whole blocks of this architecture's KV geometry
    assert m.metrics["kv.blocks_unreclaimed"].value == 0
    if config == "llama.json":  # the same run again, against the baseline it recorded: passes
        settings.update_baselines = False
        again = run_item(wl, "vllm", settings)
        assert again.verdict == "pass", again.reason
        assert [c.status for c in again.checks] == ["pass"]
