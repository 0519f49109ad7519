"""The attention implementation as an item setting: `hf:IMPL` stack entries and vLLM's `engine.attention_backend`.

Plain `hf` runs the implementation transformers picks and records it; a pinned variant is its own item, baseline
file and digest (an SDPA baseline never judges a FlashAttention run); an implementation this runner lacks skips
the item with its reason, never running another under the variant's name; one the installed transformers no
longer implements fails an item that has a baseline."""
import json
import textwrap

import pytest
import torch

from memcheck import stacks, workload
from memcheck.baselines import BaselineStore
from memcheck.errors import SoftwareUnsupported, UsageError
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
    w = load(tmp_path, "[hf, 'hf:sdpa', 'hf:eager', 'hf:flash_attention_2', 'hf:flex_attention', paged]")
    assert w.stacks == ["hf", "hf:sdpa", "hf:eager", "hf:flash_attention_2", "hf:flex_attention", "paged"]
    assert stacks.split("hf:flash_attention_2") == ("hf", "flash_attention_2") and stacks.split("hf") == ("hf", None)
    assert stacks.load("hf:eager") is stacks.load("hf")


@pytest.mark.parametrize("entry, message", [
    ("hf:flash_attn", "stacks[0]: unknown attention implementation 'flash_attn' for the hf stack; known: sdpa, eager"),
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
    assert len({w.digest(), w.digest("sdpa"), w.digest("eager"), w.digest("flash_attention_2")}) == 4
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


def test_an_implementation_transformers_lacks_for_the_model_is_the_softwares_doing(tmp_path):
    path = tmp_path / "vl.yaml"
    path.write_text(textwrap.dedent("""\
        name: vl
        model: {preset: deepseek-vl-7b, layers: 1, hidden_size: 64, intermediate_size: 128, num_attention_heads: 2,
                num_key_value_heads: 2, vocab_size: 2048}
        requests: [{prompt_tokens: 8, max_new_tokens: 2}]
        stacks: ['hf:flex_attention']
    """))
    (w,) = workload.load_file(str(path), None, stacks.names(), {})
    with pytest.raises(SoftwareUnsupported) as e:
        hf_attention.check("flex_attention", w, CPU)
    assert str(e.value).endswith("implements DeepseekVLHybridForConditionalGeneration without flex_attention")
    # FlashAttention reaches the language model and the SigLIP tower; the SAM tower has none in transformers
    parts, notes = hf_attention.per_part("flash_attention_2", w)
    assert parts["text_config"] == parts["vision_config"] == "flash_attention_2"
    assert parts["high_res_vision_config"] == "sdpa" and "SamVisionModel" in notes[0]
    assert hf_attention.per_part("sdpa", w) == ("sdpa", [])


def test_eager_runs_eager_and_is_judged_against_its_own_baseline(tmp_path):
    """A real run: hf and hf:eager each record a baseline; the eager run's model really ran eager attention, and
    plain hf what transformers picked for Qwen2 (SDPA), each recorded in the fingerprint."""
    w = load(tmp_path, "[hf, 'hf:eager']")
    settings = Settings(baselines=str(tmp_path / "baselines"), device="cpu", update_baselines=True,
                        rootdir=str(tmp_path))
    results = {s: run_item(w, s, settings) for s in w.stacks}
    assert results["hf:eager"].id == "tiny[hf:eager]" and results["hf:eager"].verdict == "new"
    assert "attention: eager (pinned)" in results["hf:eager"].measurement.notes
    assert "attention: sdpa (transformers' default for this model)" in results["hf"].measurement.notes
    assert results["hf"].measurement.environment["attention"] == "sdpa"
    assert results["hf:eager"].measurement.environment["attention"] == "eager"
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


def record(tmp_path, w, stack, **environment):
    """Record the item's baseline, then make it one recorded under other software (`environment` fields)."""
    settings = Settings(baselines=str(tmp_path / "baselines"), device="cpu", rootdir=str(tmp_path))
    assert run_item(w, stack, Settings(**{**vars(settings), "update_baselines": True})).verdict == "new"
    path = tmp_path / "baselines/cpu-x86_64/tiny" / f"{stack.replace(':', '+')}.json"
    data = json.loads(path.read_text())
    data["environment"].update(environment)
    path.write_text(json.dumps(data))
    return settings


def test_a_change_of_the_default_attention_is_named_like_a_version_bump(tmp_path):
    w = load(tmp_path)
    settings = record(tmp_path, w, "hf", attention="eager")  # as if the release before picked eager for Qwen2
    result = run_item(w, "hf", settings)
    assert "attention eager -> sdpa" in result.compared_across, result.compared_across


def test_a_skip_never_hides_a_bump(tmp_path, monkeypatch):
    """hf:sdpa has a baseline recorded under another transformers; the installed one no longer implements SDPA
    for the model (as releases have done for a model family): the item fails, naming the versions. Without a
    baseline it is skipped; a runner that lacks a package the item needs still skips it."""
    w = load(tmp_path, "['hf:sdpa']")
    settings = record(tmp_path, w, "hf:sdpa", transformers="5.0.0")
    running = __import__("transformers").__version__
    monkeypatch.setattr(hf_attention, "supports", lambda cls, attention: attention != "sdpa")
    result = run_item(w, "hf:sdpa", settings)
    assert result.verdict == "error" and result.failed
    assert result.reason == (f"no longer runs: transformers {running} implements Qwen2ForCausalLM without sdpa; "
                             f"its baseline ran before transformers 5.0.0 -> {running}")
    assert result.compared_across == [f"transformers 5.0.0 -> {running}"]

    fresh = run_item(w, "hf:sdpa", Settings(baselines=str(tmp_path / "none"), device="cpu", rootdir=str(tmp_path)))
    assert fresh.verdict == "skipped" and not fresh.failed


def test_a_runner_that_lacks_a_package_still_skips(tmp_path, monkeypatch):
    if hf_attention.flash_attn_version() is not None:
        pytest.skip("flash-attn is installed here")
    w = load(tmp_path, "['hf:flash_attention_2']")
    base = tmp_path / "baselines/cpu-x86_64/tiny/hf+flash_attention_2.json"
    base.parent.mkdir(parents=True)
    base.write_text("{}")  # would be an error if it were read: a runner's skip never reads its baseline
    result = run_item(w, "hf:flash_attention_2", Settings(baselines=str(tmp_path / "baselines"), device="cpu"))
    assert result.verdict == "skipped" and not result.failed
