"""The decode step's linear layers (memcheck/kernels/skinny_gemm.py, under the interpreter) against F.linear: rows 1 to 64,
ragged column blocks and K slices, bias, rows read from a strided view, and the split-K tickets left at zero for
the next call (a CUDA graph replays the same counters)."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from kernel_helpers import assert_close, randn  # noqa: E402
from memcheck.kernels import skinny_gemm  # noqa: E402

Tiles = skinny_gemm.Tiles


def operands(rows, n, k, dtype=torch.float32, bias=False, seed=0):
    gen = torch.Generator().manual_seed(seed + rows * 1000 + n + k)
    x = randn(gen, rows, k, dtype=dtype)
    w = (randn(gen, n, k) / k ** 0.5).to(dtype)
    b = randn(gen, n, dtype=dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("split", [1, 2, 3])
def test_equals_f_linear(rows, split):
    x, w, b = operands(rows, 50, 96, bias=True)  # 50 columns: a ragged last block of 16; 96 = 3 tiles of 32
    out = skinny_gemm.linear(x, w, b, tiles=Tiles(block_n=16, block_k=32, split=split, warps=4, stages=1))
    assert out.shape == (rows, 50)
    assert_close(out, F.linear(x, w, b))


@pytest.mark.parametrize("k", [40, 100])  # K not a multiple of the tile: the masked loads
def test_ragged_k(k):
    x, w, _ = operands(8, 33, k)
    out = skinny_gemm.linear(x, w, tiles=Tiles(block_n=16, block_k=32, split=2, warps=4, stages=1))
    assert_close(out, F.linear(x, w))


def test_bfloat16_rounds_once_like_cublas():
    x, w, b = operands(8, 64, 128, dtype=torch.bfloat16, bias=True)
    out = skinny_gemm.linear(x, w, b, tiles=Tiles(block_n=16, block_k=32, split=4, warps=4, stages=1))
    assert out.dtype == torch.bfloat16
    ref = (x.float() @ w.float().T + b.float()).to(torch.bfloat16)  # fp32 sum, one rounding
    assert (out.float() - ref.float()).abs().max() <= 2 ** -7 * ref.float().abs().max()


def test_rows_from_a_strided_view():
    """The down projection reads the gate half of the [gate | up] rows in place (row stride 2 x width)."""
    x, w, _ = operands(6, 24, 64)
    gate_up = torch.cat([x, torch.full_like(x, float("nan"))], dim=1)
    out = skinny_gemm.linear(gate_up[:, :64], w, tiles=Tiles(block_n=16, block_k=32, split=2, warps=4, stages=1))
    assert_close(out, F.linear(x, w))


def test_tickets_are_zero_after_a_call_and_a_second_call_agrees():
    x, w, _ = operands(4, 48, 128)
    tiles = Tiles(block_n=16, block_k=32, split=4, warps=4, stages=1)
    first = skinny_gemm.linear(x, w, tiles=tiles)
    assert int(skinny_gemm._ticket_counters(x.device, 0).abs().sum()) == 0
    assert torch.equal(skinny_gemm.linear(x, w, tiles=tiles), first)


def test_leading_dims_and_many_rows_fall_back():
    x, w, _ = operands(3, 20, 32)
    out = skinny_gemm.linear(x.view(3, 1, 32), w)  # [..., K]: the CPU's interpreter tile
    assert out.shape == (3, 1, 20)
    assert_close(out.view(3, 20), F.linear(x, w))
    assert skinny_gemm.tiles_for(torch.device("cpu"), skinny_gemm.MAX_ROWS + 1, 20, 32) is None


def test_cuda_runs_cublas_without_a_measured_tile_or_outside_a_graph_capture(monkeypatch):
    """On a GPU only measured tiles run the kernel, and only into a CUDA graph: an unknown GPU or product, or an
    eager launch, gets None (cuBLAS)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(skinny_gemm, "_ticket_counters", lambda device, blocks: None)  # (no CUDA here)
    monkeypatch.setattr(skinny_gemm, "_tables", {})
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(skinny_gemm, "_measured", {"NVIDIA H200": {"16x4608x3584": Tiles(64, 128, 4, 4, 4)}})
    assert skinny_gemm.tiles_for(cuda, 8, 4608, 3584) is None  # eager
    capturing[0] = True
    assert skinny_gemm.tiles_for(cuda, 8, 4608, 3584) == Tiles(64, 128, 4, 4, 4)
    assert skinny_gemm.tiles_for(cuda, 17, 4608, 3584) is None  # the 32-row bucket was not measured
    assert skinny_gemm.tiles_for(cuda, 8, 3584, 3584) is None
    skinny_gemm.use_tiles("NVIDIA H200", {"32x4608x3584": [32, 256, 1, 4, 3]})
    assert skinny_gemm.tiles_for(cuda, 17, 4608, 3584) == Tiles(32, 256, 1, 4, 3)


def test_committed_table_holds_tiles_the_kernel_takes(monkeypatch):
    """memcheck/kernels/skinny_gemm_tiles.json (written by benchmarks/paged_h200.py on each GPU): every entry is a rows bucket
    and a product, and its tile runs right here (same kernel, smaller product: K slices of whole tiles)."""
    monkeypatch.setattr(skinny_gemm, "_measured", None)
    table = skinny_gemm._load()
    assert table, "memcheck/kernels/skinny_gemm_tiles.json holds no GPU"
    for gpu, shapes in table.items():
        for key, tiles in shapes.items():
            rows, n, k = map(int, key.split("x"))
            assert rows == skinny_gemm.rows_bucket(rows) and 0 < rows <= skinny_gemm.MAX_ROWS, (gpu, key)
            assert n > 0 and k >= tiles.block_k * tiles.split, (gpu, key, tiles)
            x, w, b = operands(rows // 2 + 1, tiles.block_n + 3, tiles.block_k * tiles.split)
            assert_close(skinny_gemm.linear(x, w, b, tiles=tiles._replace(stages=1)), F.linear(x, w, b))
