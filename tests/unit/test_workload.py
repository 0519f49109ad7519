import textwrap

import pytest

from memcheck import project, stacks, workload
from memcheck.errors import UsageError

EXAMPLE = """\
name: tiny-dense-batch
model:
  preset: r1-distill-qwen-7b
  layers: 2          # any architecture field of the preset may be overridden; the report marks it scaled
  hidden_size: 256
  intermediate_size: 512
  num_attention_heads: 4
  num_key_value_heads: 2
  vocab_size: 1024
requests:
  - count: 4
    prompt_tokens: 64
    max_new_tokens: 16
stacks: [hf]
thresholds:
  gpu.heap_alloc.peak: {max_increase: 2%}
  host.rss.peak: {max_increase: 25%}
"""


def load(tmp_path, text, profile=None):
    path = tmp_path / "w.yaml"
    path.write_text(textwrap.dedent(text))
    return workload.load_file(str(path), profile, stacks.names(), project.load(tmp_path).thresholds)


def test_issue_example_is_accepted_verbatim(tmp_path):
    (w,) = load(tmp_path, EXAMPLE)
    assert w.name == "tiny-dense-batch" and w.stacks == ["hf"] and w.scaled
    cfg = w.model_config()
    assert cfg["num_hidden_layers"] == 2 and cfg["num_key_value_heads"] == 2 and cfg["model_type"] == "qwen2"
    assert w.thresholds["host.rss.peak"].relative == 0.25
    assert len(w.request_list()) == 4


def test_profiles_and_many_workloads(tmp_path):
    text = """\
    defaults:
      model: {preset: deepseek-v2-lite, layers: 2}
      profiles:
        ci: {model: {hidden_size: 128, moe_intermediate_size: 64, intermediate_size: 256, heads: 2}}
    workloads:
      - name: a
        requests: [{prompt_tokens: 8, max_new_tokens: 2}]
      - name: b
        requests: [{prompt_tokens: 8, max_new_tokens: 2, count: 3}]
    """
    a, b = load(tmp_path, text, profile="ci")
    assert a.model_config()["hidden_size"] == 128 and a.profile == "ci"
    full_a, _ = load(tmp_path, text, profile=None)
    assert full_a.model_config()["hidden_size"] == 2048 and full_a.digest() != a.digest()
    with pytest.raises(UsageError, match="profile 'gpu' is not defined"):
        load(tmp_path, text, profile="gpu")


# Each class of user mistake: (replace this, with that) in the example -> (line, field, message part).
BAD = [
    ("  - count: 4", "  -count: 4", 12, None, "YAML syntax"),
    ("name: tiny-dense-batch\n", "name: tiny-dense-batch\nname: again\n", 2, "name", "duplicate key"),
    ("stacks: [hf]", "stackz: [hf]", 14, "stackz", "unknown key"),
    ("layers: 2 ", "layerz: 2 ", 4, "model.layerz", "not an architecture field"),
    ("count: 4", "count: four", 11, "requests[0].count", "must be an integer"),
    ("count: 4", "count: -4", 11, "requests[0].count", "at least 1"),
    ("prompt_tokens: 64", "prompt_tokens: 640000000", 12, "requests[0].prompt_tokens", "absurdly large"),
    ("prompt_tokens: 64", "prompt_tokens: 200000", 11, "requests[0]", "max_position_embeddings"),
    ("hidden_size: 256", "hidden_size: -256", 5, "model.hidden_size", "out of range"),
    ("preset: r1-distill-qwen-7b", "preset: llama-9000", 3, "model.preset", "unknown preset"),
    ("stacks: [hf]", "stacks: [tensorrt]", 14, "stacks[0]", "unknown stack"),
    ("gpu.heap_alloc.peak: {max_increase: 2%}", "gpu.heap.peak: {max_increase: 2%}", 16,
     "thresholds.gpu.heap.peak", "unknown metric"),
    ("{max_increase: 25%}", "{max_increase: 25 percent}", 17, "thresholds.host.rss.peak.max_increase", "is not a percentage (2%) or a size"),
    ("num_key_value_heads: 2", "num_key_value_heads: 3", 2, "model", "multiple of num_key_value_heads"),
    ("stacks: [hf]", "stacks: [hf]\nengine: {block_size: x}", 15, "engine.block_size", "must be an integer"),
    ("stacks: [hf]", "stacks: [hf]\nengine: {gpu_memory_utilization: 1.5}", 15, "engine.gpu_memory_utilization",
     "fraction"),
    ("requests:\n  - count: 4\n    prompt_tokens: 64\n    max_new_tokens: 16\n", "requests: []\n", 10,
     "requests", "at least one"),
]


@pytest.mark.parametrize("old,new,line,field,message", BAD, ids=[b[4] for b in BAD])
def test_bad_input_is_one_line_naming_file_line_field(tmp_path, old, new, line, field, message):
    assert old in EXAMPLE
    with pytest.raises(UsageError) as e:
        load(tmp_path, EXAMPLE.replace(old, new, 1))
    err = e.value
    assert message in str(err) and err.path.endswith("w.yaml") and "\n" not in str(err)
    assert err.field == field
    assert err.line == line, str(err)


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        workload.load_file(str(tmp_path / "nope.yaml"), None, {"hf"}, {})


def test_images_only_for_vision_presets(tmp_path):
    with pytest.raises(UsageError, match="takes no images"):
        load(tmp_path, EXAMPLE.replace("max_new_tokens: 16", "max_new_tokens: 16\n    images: 1"))
