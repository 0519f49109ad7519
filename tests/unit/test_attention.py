"""The attention implementation as an item setting: `hf:IMPL` stack entries and vLLM's `engine.attention_backend`.

A variant is its own item, baseline file and digest (an SDPA baseline never judges a FlashAttention run); an
implementation this runner lacks skips the item with its reason, never running SDPA under the variant's name."""
import textwrap

import pytest
import torch

from memcheck import stacks, workload
from memcheck.baselines import BaselineStore
from memcheck.errors import UsageError
from memcheck.measure_round import measure
from memcheck.runner import Settings, run_item
from memcheck.stacks import hf_attention
from memcheck.stacks.vllm import VLLMStack

TINY = """\
name: tiny
model: {{preset: r1-distill-qwen-7b, layers: 1, hidden_size: 64, intermediate_size: 128, num_attention_heads: 2,
        num_key_value_heads: 1, vocab_size: 128}}
requests: [{{count: 2, prompt_tokens: 8, max_new_tokens: 3}}]
stacks: {stacks}
{extra}
"""
CPU = torch.device("cpu")


def load(tmp_path, stacks_yaml="[hf]", extra=""):
    path = tmp_path / "w.yaml"
    path.write_text(textwrap.dedent(TINY.format(stacks=stacks_yaml, extra=extra)))
    return workload.load_file(str(path), None, stacks.names(), {})[0]


def test_variants_are_items_of_their_own(tmp_path):
    w = load(tmp_path, "[hf, 'hf:eager', 'hf:flash_attention_2', 'hf:flex_attention', paged]")
    assert w.stacks == ["hf", "hf:eager", "hf:flash_attention_2", "hf:flex_attention", "paged"]
    assert stacks.split("hf:flash_attention_2") == ("hf", "flash_attention_2") and stacks.split("hf") == ("hf", None)
    assert stacks.load("hf:eager") is stacks.load("hf")


@pytest.mark.parametrize("entry, message", [
    ("hf:flash_attn", "stacks[0]: unknown attention implementation 'flash_attn' for the hf stack; known: sdpa, eager"),
    ("hf:sdpa", "stacks[0]: sdpa is what plain 'hf' runs: write 'hf'"),
    ("paged:eager", "stacks[0]: the paged stack has no attention variants (write 'paged')"),
    ("nope:eager", "stacks[0]: unknown stack 'nope'"),
])
def test_a_bad_variant_is_a_one_line_usage_error(tmp_path, entry, message):
    with pytest.raises(UsageError) as e:
        load(tmp_path, f"['{entry}']")
    assert message in str(e.value) and "w.yaml" in str(e.value)


def test_a_stack_listed_twice_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"stacks\[1\]: 'hf:eager' is listed twice"):
        load(tmp_path, "['hf:eager', 'hf:eager']")


def test_the_attention_is_part_of_the_digest_and_the_baseline_file(tmp_path):
    w = load(tmp_path)
    assert w.digest() == w.digest(None)  # plain entries: the digests of existing baselines do not move
    assert len({w.digest(), w.digest("eager"), w.digest("flash_attention_2")}) == 3
    store = BaselineStore(tmp_path / "baselines")
    assert store.path("cpu-x86_64", "tiny", "hf").name == "hf.json"
    assert store.path("cpu-x86_64", "tiny", "hf:flash_attention_2").name == "hf+flash_attention_2.json"


def test_flash_attention_without_flash_attn_is_skipped_with_the_reason(tmp_path):
    w = load(tmp_path, "['hf:flash_attention_2']")
    m = measure(w, "hf:flash_attention_2", CPU)
    if hf_attention.flash_attn_version() is None:
        assert m.skipped == "flash-attn is not installed on this runner (transformers' flash_attention_2 needs it)"
    else:
        assert m.skipped.startswith("flash_attention_2 runs on CUDA only (flash-attn ")
    assert m.id == "tiny[hf:flash_attention_2]" and not m.metrics


def test_an_implementation_transformers_lacks_for_the_model_is_skipped(tmp_path):
    path = tmp_path / "vl.yaml"
    path.write_text(textwrap.dedent("""\
        name: vl
        model: {preset: deepseek-vl-7b, layers: 1, hidden_size: 64, intermediate_size: 128, num_attention_heads: 2,
                num_key_value_heads: 2, vocab_size: 2048}
        requests: [{prompt_tokens: 8, max_new_tokens: 2}]
        stacks: ['hf:flex_attention']
    """))
    (w,) = workload.load_file(str(path), None, stacks.names(), {})
    reason = hf_attention.unavailable("flex_attention", w, CPU)
    assert reason.endswith("implements DeepseekVLHybridForConditionalGeneration without flex_attention")
    # FlashAttention reaches the language model and the SigLIP tower; the SAM tower has none in transformers
    parts, notes = hf_attention.per_part("flash_attention_2", w)
    assert parts["text_config"] == parts["vision_config"] == "flash_attention_2"
    assert parts["high_res_vision_config"] == "sdpa" and "SamVisionModel" in notes[0]
    assert hf_attention.per_part("sdpa", w) == ("sdpa", [])


def test_eager_runs_eager_and_is_judged_against_its_own_baseline(tmp_path):
    """A real run: hf and hf:eager each record a baseline; the eager run's model really ran eager attention."""
    w = load(tmp_path, "[hf, 'hf:eager']")
    settings = Settings(baselines=str(tmp_path / "baselines"), device="cpu", update_baselines=True,
                        rootdir=str(tmp_path))
    results = {s: run_item(w, s, settings) for s in w.stacks}
    assert results["hf:eager"].id == "tiny[hf:eager]" and results["hf:eager"].verdict == "new"
    assert "attention: eager" in results["hf:eager"].measurement.notes
    assert "attention: sdpa" in results["hf"].measurement.notes
    assert (tmp_path / "baselines/cpu-x86_64/tiny/hf+eager.json").is_file()
    assert results["hf"].measurement.digest != results["hf:eager"].measurement.digest
    again = run_item(w, "hf:eager", Settings(baselines=str(tmp_path / "baselines"), device="cpu",
                                             rootdir=str(tmp_path)))
    assert again.verdict in ("pass", "improved") and again.baseline_path.endswith("hf+eager.json")


def test_vllm_attention_backend_is_an_engine_setting(tmp_path):
    w = load(tmp_path, "[vllm]", "engine: {attention_backend: FLASH_ATTN}")
    assert w.engine == {"attention_backend": "FLASH_ATTN"}
    assert VLLMStack(w, CPU).engine_args(w.model_config())["attention_backend"] == "FLASH_ATTN"  # vLLM's own arg
    assert w.digest() != load(tmp_path, "[vllm]").digest()
    with pytest.raises(UsageError, match="engine.attention_backend: must be a vLLM attention backend name"):
        load(tmp_path, "[vllm]", "engine: {attention_backend: flash-attn}")


def test_vllm_cpu_skips_a_gpu_backend_rather_than_run_its_own_under_that_name(tmp_path, monkeypatch):
    monkeypatch.setattr("memcheck.stacks.vllm.vllm_importable", lambda: True)
    w = load(tmp_path, "[vllm]", "engine: {attention_backend: FLASHINFER}")
    with pytest.raises(stacks.StackUnavailable, match="FLASHINFER needs a GPU runner: vllm-cpu runs CPU_ATTN"):
        VLLMStack.check(w, CPU)


def test_a_missing_implementation_is_skipped_before_any_worker_starts(tmp_path, monkeypatch):
    if hf_attention.flash_attn_version() is not None:
        pytest.skip("flash-attn is installed here")
    w = load(tmp_path, "['hf:flash_attention_2']")

    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started for an item that cannot run here")

    monkeypatch.setattr("memcheck.runner.subprocess.run", no_worker)
    result = run_item(w, "hf:flash_attention_2", Settings(baselines=str(tmp_path / "b"), device="cpu"))
    assert result.verdict == "skipped" and result.reason.startswith("flash-attn is not installed")
    assert result.measurement.digest == w.digest("flash_attention_2")
