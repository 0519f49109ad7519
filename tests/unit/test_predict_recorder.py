"""The fake device as the stacks see it: every CUDA storage counted by the allocator model when it is made and when
its last tensor dies, host tensors real, device values read as 0, kernels launched as no-ops, graphs capturing into
a pool that outlives empty_cache."""
import gc

import pytest
import torch

from memcheck.predict.gpus import gpu
from memcheck.predict.session import Prediction

MiB = 1 << 20


@pytest.fixture
def prediction():
    return Prediction(gpu("nvidia-h200"))


def allocated(p) -> int:
    return p.allocator.stats()["allocated_bytes.all.current"]


def test_allocations_and_frees_follow_the_tensors(prediction):
    with prediction.running():
        a = torch.empty(MiB // 4, device="cuda")  # 1 MiB of float32
        assert allocated(prediction) == MiB
        b = a + 1
        view = b[10:]
        del b
        assert allocated(prediction) == 2 * MiB  # the view keeps its storage
        del view
        assert allocated(prediction) == MiB
        small = torch.empty(3, device="cuda", dtype=torch.int8)  # rounded up to the 512-byte block
        assert allocated(prediction) == MiB + 512
        del a, small
        gc.collect()
        assert allocated(prediction) == 0
        assert prediction.allocator.stats()["allocated_bytes.all.peak"] == 2 * MiB


def test_the_host_stays_real_and_a_device_value_reads_zero(prediction):
    with prediction.running():
        ids = torch.tensor([5, 7, 9])
        assert ids.tolist() == [5, 7, 9] and ids.sum().item() == 21  # real: the engine reads its own host tensors
        on_device = ids.to(torch.device("cuda", 0), non_blocking=True)
        assert on_device.device.type == "cuda" and allocated(prediction) == 512
        assert (on_device * 2).argmax().item() == 0  # a value computed on the device: unknown, read as 0
        pinned = torch.zeros(4, dtype=torch.int32, pin_memory=True)  # a CPU-only torch has no pinned allocator
        assert pinned.tolist() == [0, 0, 0, 0]


def test_cublas_workspace_once_per_stream(prediction):
    with prediction.running():
        x = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
        before = allocated(prediction)
        y = x @ x
        assert allocated(prediction) - before == 32 * MiB + 8192  # the sm_90 workspace, then the product
        z = x @ x
        assert allocated(prediction) - before == 32 * MiB + 2 * 8192
        del y, z


def test_graph_capture_allocates_in_its_pool(prediction):
    with prediction.running():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
            held = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
            scratch = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
            del scratch
        graph.replay()  # allocates nothing
        reserved = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()  # the pool's segment stays: the graph may replay
        assert torch.cuda.memory_reserved() == reserved > 0
        assert torch.cuda.memory_allocated() == 4 * MiB + 2 * 512  # and the generator's graph seed and offset
        del held


def test_a_triton_launch_runs_nothing(prediction):
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def fill(out, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out + i, 1.0, mask=i < n)

    with prediction.running():
        out = torch.empty(16, device="cuda")
        assert fill[(1,)](out, 16, BLOCK=16) is None
        assert torch.cuda.get_device_properties(0).multi_processor_count == 132
        assert torch.cuda.get_device_name() == "NVIDIA H200"
    assert not torch.cuda.is_available()  # restored after the prediction


def test_more_than_the_gpu_holds_is_out_of_memory(prediction):
    """An item that would not fit on the GPU is predicted to run out of memory (the item's error is of kind oom)."""
    with prediction.running():
        kept = torch.empty(100 << 30, dtype=torch.uint8, device="cuda")
        with pytest.raises(MemoryError, match="out of memory"):
            torch.empty(50 << 30, dtype=torch.uint8, device="cuda")  # 150 GiB > the H200's 143771 MiB
        del kept
    assert prediction.allocator.stats()["num_ooms"] == 1
