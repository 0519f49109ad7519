"""The vllm stack's CUDA path against vLLM's own classes, as the vLLM in constraints-gpu.txt defines them:
ProfiledWorker (the worker_cls the stack passes on GPU runners) around vLLM's real `memory_profiling`,
`MemoryProfilingResult` and `Worker`, on a simulated device allocator (no GPU here has vLLM), and the
engine arguments through vLLM's EngineArgs. A vLLM API change breaks a test here, not a user's GPU job.
Runs where this interpreter imports vllm; test_vllm_stack.py runs this file under the vLLM environment."""
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from memcheck.stacks.vllm import GPU_BLOCK_SIZE, WORKER_CLS, VLLMStack, vllm_importable

if not vllm_importable():  # importorskip would take this folder (tests/vllm) for the package
    pytest.skip("these tests use vLLM's classes: run them under .venv-vllm", allow_module_level=True)

import vllm  # noqa: E402
import vllm.config  # noqa: E402
from vllm.utils import mem_utils  # noqa: E402
from vllm.v1.worker import gpu_worker  # noqa: E402

from memcheck.stacks.vllm_profile import PROFILE_METRICS, profile_metrics, read_profile  # noqa: E402
from memcheck.stacks.vllm_worker import ProfiledWorker  # noqa: E402
from memcheck.workload import load_file  # noqa: E402

GiB = 1 << 30
CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints-gpu.txt"


class Device:
    """A CUDA device as vLLM's mem_utils reads it through torch.accelerator: allocator counters, free memory."""

    def __init__(self, total=80 * GiB):
        self.total, self.allocated, self.peak, self.reserved, self.other = total, 0, 0, 0, 0

    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def free(self, n):
        self.allocated -= n

    def install(self, monkeypatch):
        acc = torch.accelerator
        monkeypatch.setattr(acc, "memory_stats", lambda d=None: {"allocated_bytes.all.peak": self.peak,
                                                                 "allocated_bytes.all.current": self.allocated})
        monkeypatch.setattr(acc, "get_memory_info", lambda d=None: (self.total - self.reserved - self.other,
                                                                   self.total))
        monkeypatch.setattr(acc, "memory_reserved", lambda d=None: self.reserved)
        monkeypatch.setattr(acc, "empty_cache", lambda: setattr(self, "reserved", self.allocated))
        monkeypatch.setattr(acc, "reset_peak_memory_stats", lambda d=None: setattr(self, "peak", self.allocated))


class Runner:
    """What ProfiledWorker uses of vLLM's GPUModelRunner: weights loaded, a profile run, graph capture."""

    def __init__(self, device, weights, activations, non_torch, graphs):
        self.device, self.activations, self.non_torch, self.graphs = device, activations, non_torch, graphs
        device.alloc(weights)
        self.model_memory_usage = weights

    def profile_run(self, randomize_inputs=False):
        self.device.alloc(self.activations)  # the forward's activations, freed when it returns
        self.device.free(self.activations)
        self.device.other += self.non_torch  # e.g. cuBLAS workspace: outside torch's allocator

    def capture_model(self):
        self.device.other += self.graphs
        return self.graphs


def worker(device, kv_cache_memory_bytes, eager=False):
    """A ProfiledWorker with the state vLLM's init_device and load_model leave (no CUDA here)."""
    w = object.__new__(ProfiledWorker)
    w.init_snapshot = mem_utils.MemorySnapshot(device="cpu")  # measured through the simulated device
    w.model_runner = Runner(device, weights=3 * GiB, activations=GiB // 2, non_torch=GiB // 4, graphs=GiB // 8)
    w.cache_config = type("CacheConfig", (), {"kv_cache_memory_bytes": kv_cache_memory_bytes})()
    w.model_config = type("ModelConfig", (), {"enforce_eager": eager})()
    return w


def vllm_profiling_worker(self):
    """vLLM's Worker.determine_available_memory reduced to what it does with memory_profiling: the default
    path profiles the profile run inside gpu_worker.memory_profiling; the kv_cache_memory_bytes path only
    runs it. (The real method needs a CUDA device and a VllmConfig.)"""
    if self.cache_config.kv_cache_memory_bytes:
        self.model_runner.profile_run(randomize_inputs=False)
        return self.cache_config.kv_cache_memory_bytes
    with gpu_worker.memory_profiling(self.init_snapshot,
                                     weights_memory=int(self.model_runner.model_memory_usage)) as result:
        self.model_runner.profile_run(randomize_inputs=False)
    return 70 * GiB - result.non_kv_cache_memory


@pytest.fixture
def device(monkeypatch):
    d = Device()
    d.install(monkeypatch)
    monkeypatch.setattr(gpu_worker.Worker, "determine_available_memory", vllm_profiling_worker)
    monkeypatch.setattr(gpu_worker.Worker, "compile_or_warm_up_model",
                        lambda self: None if self.model_config.enforce_eager else self.model_runner.capture_model())
    return d


@pytest.mark.parametrize("kv_bytes", [None, 2 * GiB], ids=["vllm-sizes-the-pool", "workload-sizes-the-pool"])
def test_profile_is_vllms_memory_profiling_result_either_way(device, kv_bytes):
    w = worker(device, kv_bytes)
    available = w.determine_available_memory()
    w.compile_or_warm_up_model()
    assert isinstance(w.memcheck_profile, mem_utils.MemoryProfilingResult)
    assert available == (kv_bytes or 70 * GiB - w.memcheck_profile.non_kv_cache_memory)
    assert gpu_worker.memory_profiling is mem_utils.memory_profiling  # the wrap is undone
    assert "capture_model" not in vars(w.model_runner)
    metrics = profile_metrics([read_profile(w)])
    assert {k: v.value for k, v in metrics.items()} == {
        "vllm.weights": 3 * GiB, "vllm.activation.peak": GiB // 2, "vllm.non_torch.increase": GiB // 4,
        "vllm.cuda_graph.pool": GiB // 8}
    assert "torch_peak_increase" in metrics["vllm.activation.peak"].detail


def test_a_grown_activation_peak_moves_the_metric_not_the_pool(device):
    small, large = worker(device, 2 * GiB), None
    small.determine_available_memory()
    device.__init__()
    large = worker(device, 2 * GiB)
    large.model_runner.activations = GiB
    assert large.determine_available_memory() == 2 * GiB  # the pool the workload asked for, unchanged
    assert read_profile(large)["vllm.activation.peak"] - read_profile(small)["vllm.activation.peak"] == GiB // 2


def test_eager_engines_have_an_empty_graph_pool_and_workers_without_a_profile_are_null(device):
    w = worker(device, 2 * GiB, eager=True)
    w.determine_available_memory()
    w.compile_or_warm_up_model()
    assert read_profile(w)["vllm.cuda_graph.pool"] == 0
    cpu = profile_metrics([None])
    assert all(cpu[n].value is None and "CPU worker runs no memory profile" in cpu[n].reason for n in PROFILE_METRICS)
    two = profile_metrics([read_profile(w), {**read_profile(w), "vllm.activation.peak": 1}])
    assert two["vllm.activation.peak"].value == read_profile(w)["vllm.activation.peak"]
    assert "largest of 2 workers" in two["vllm.activation.peak"].detail


def test_vllms_classes_have_what_the_stack_reads():
    """Names and signatures the CUDA path relies on, as vLLM defines them."""
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert resolve_obj_by_qualname(WORKER_CLS) is ProfiledWorker and issubclass(ProfiledWorker, gpu_worker.Worker)
    assert list(inspect.signature(gpu_worker.Worker.determine_available_memory).parameters) == ["self"]
    assert list(inspect.signature(gpu_worker.Worker.compile_or_warm_up_model).parameters) == ["self"]
    assert list(inspect.signature(GPUModelRunner.capture_model).parameters) == ["self"]
    assert list(inspect.signature(mem_utils.memory_profiling).parameters) == ["baseline_snapshot", "weights_memory"]
    # What ProfiledWorker wraps is what vLLM's real methods call (the tests above run a reduced copy of them).
    determine = inspect.getsource(gpu_worker.Worker.determine_available_memory)
    assert "with (\n            memory_profiling(" in determine and "self.cache_config.kv_cache_memory_bytes" in determine
    assert "self.model_runner.capture_model()" in inspect.getsource(gpu_worker.Worker.compile_or_warm_up_model)
    fields = {f.name for f in dataclasses.fields(mem_utils.MemoryProfilingResult)}
    assert {"torch_peak_increase", "non_torch_increase", "weights_memory"} <= fields
    assert "kv_cache_max_concurrency" in {f.name for f in dataclasses.fields(vllm.config.CacheConfig)}
    assert vllm.config.CacheConfig.DEFAULT_BLOCK_SIZE == GPU_BLOCK_SIZE
    pinned = [line for line in CONSTRAINTS.read_text().splitlines() if line.startswith("vllm==")]
    assert pinned and vllm.__version__.startswith(pinned[0].removeprefix("vllm==").rstrip("*").rstrip(".")), (
        f"these tests cover {pinned}; this is vLLM {vllm.__version__}")


def test_gpu_engine_arguments_are_vllms(tmp_path):
    """The arguments a GPU runner passes are fields of vLLM's EngineArgs, and the pool is the workload's."""
    from vllm.engine.arg_utils import EngineArgs

    path = tmp_path / "w.yaml"
    path.write_text("name: w\nmodel: {preset: r1-distill-qwen-7b, layers: 2, hidden_size: 256, intermediate_size: "
                    "512, num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 1024}\n"
                    "requests: [{count: 3, prompt_tokens: 100, max_new_tokens: 30}]\nstacks: [vllm]\n")
    wl = load_file(str(path), None, {"vllm"}, {})[0]
    args = VLLMStack(wl, torch.device("cuda")).engine_args(wl.model_config())
    assert args["worker_cls"] == WORKER_CLS and "gpu_memory_utilization" not in args
    assert args["num_gpu_blocks_override"] == 3 * 9 + 1  # 130 tokens in blocks of 16, and the null block
    engine = EngineArgs(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, **args)
    assert engine.kv_cache_memory_bytes == args["kv_cache_memory_bytes"] == 28 * 16 * 2 * 2 * 2 * 64 * 2
