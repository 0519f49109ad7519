"""A prediction gates like a measurement: `pytest --memcheck --memcheck-predict nvidia-h200` on this CPU runs a paged
workload at its full profile on fake CUDA tensors, records its baseline under nvidia-h200-predicted/, passes when
nothing changed (to the byte), and fails the regressions injected into the engine: a device buffer kept per step,
a block never handed back."""
import json

import pytest
from conftest import ROOT, install_stack, workload

LEAKY_STACK = (ROOT / "benchmarks" / "workloads" / "leakystack.py").read_text()  # the paged engine, two leaks
BASELINE = "baselines/nvidia-h200-predicted/tiny/leaky.json"


@pytest.fixture
def project(pytester, monkeypatch):
    install_stack(pytester, monkeypatch, "leaky", LEAKY_STACK, "LeakyPaged")
    for name in ("LEAK_KIB_PER_STEP", "LEAK_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makefile(".toml", pyproject="[tool.memcheck]\n")
    (pytester.mkdir("suites") / "tiny.yaml").write_text(workload(stacks="leaky, hf").replace(
        "max_new_tokens: 4", "max_new_tokens: 64"))
    return pytester


def predict(pytester, *args):
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memcheck", "--memcheck-predict",
                                           "nvidia-h200", "--memcheck-report", "r.json", *args)
    items = {i["stack"]: i for i in json.loads((pytester.path / "r.json").read_text())["items"]}
    return result, items


def test_a_prediction_gates_the_paged_engine(project, monkeypatch):
    result, items = predict(project, "--memcheck-update-baselines")
    assert result.ret == 0, result.stdout.str()
    leaky = items["leaky"]
    assert leaky["verdict"] == "new" and (project.path / BASELINE).is_file()
    metrics = leaky["metrics"]
    assert metrics["predicted.gpu.heap_alloc.peak"]["value"] > 32 << 20  # weights, KV pool, the cuBLAS workspace
    assert metrics["predicted.gpu.reserved.peak"]["value"] >= metrics["predicted.gpu.heap_alloc.peak"]["value"]
    assert metrics["gpu.heap_alloc.peak"]["value"] is None  # never a prediction under a measured name
    assert "predicted.gpu" in metrics["gpu.heap_alloc.peak"]["reason"]
    assert metrics["kv.blocks_unreclaimed"]["value"] == 0 and metrics["kv.bytes.peak"]["value"] > 0
    assert metrics["kv.page_footprint"]["value"] is None and metrics["host.rss.peak"]["value"] is None
    assert leaky["environment"]["gpu"] == "NVIDIA H200 (predicted)"
    assert "GenerationMixin._sample" in items["hf"]["skipped"]  # why the hf stack cannot be predicted, precisely
    result.stdout.fnmatch_lines(["*predicted.gpu.heap_alloc.peak*", "*tiny[[]leaky[]]*new*"])

    result, items = predict(project)  # nothing changed: the same bytes
    assert result.ret == 0 and items["leaky"]["verdict"] == "pass", result.stdout.str()

    monkeypatch.setenv("LEAK_KIB_PER_STEP", "512")  # a buffer kept per engine step
    result, items = predict(project)
    assert result.ret == 1 and items["leaky"]["verdict"] == "regressed"
    failing = {c["metric"] for c in items["leaky"]["checks"] if c["status"] == "regressed"}
    assert {"predicted.gpu.heap_alloc.peak", "predicted.gpu.heap_alloc.end"} <= failing

    monkeypatch.delenv("LEAK_KIB_PER_STEP")
    monkeypatch.setenv("LEAK_BLOCKS", "1")  # a finished sequence's blocks never handed back
    result, items = predict(project)
    assert result.ret == 1 and items["leaky"]["verdict"] == "regressed"
    failing = {c["metric"] for c in items["leaky"]["checks"] if c["status"] == "regressed"}
    assert "kv.blocks_unreclaimed" in failing


@pytest.mark.parametrize("name", ["h100", ""])
def test_an_unknown_gpu_is_refused_in_one_line(project, name):
    """An unknown name, or an empty one (`--memcheck-predict "$GPU"` with GPU unset), never falls back to measuring."""
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--memcheck", "--memcheck-predict", name)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--memcheck-predict: no GPU named '{name}' (known: nvidia-h200)" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
