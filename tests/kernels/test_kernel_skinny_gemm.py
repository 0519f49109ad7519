"""The decode step's linear layers (kernels/skinny_gemm.py, under the interpreter) against F.linear: rows 1 to 64,
ragged column blocks and K slices, bias, rows read from a strided view, and the split-K tickets left at zero for
the next call (a CUDA graph replays the same counters). The gated product (the down projection reading silu(gate)
* up of a gated MLP's [gate | up] rows) against silu_mul_ then linear, and its fallback: those two, as before."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import kernels  # noqa: E402
from kernel_helpers import assert_close, randn  # noqa: E402
from kernels import activation, reference, skinny_gemm  # noqa: E402

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
    monkeypatch.setattr(skinny_gemm, "_measured", {"NVIDIA H200": {"16x4608x3584": Tiles(64, 128, 4, 4, 4),
                                                                   "16x3584x18944:silu": Tiles(64, 256, 2, 4, 4)}})
    assert skinny_gemm.tiles_for(cuda, 8, 4608, 3584) is None  # eager
    assert skinny_gemm.tiles_for(cuda, 8, 3584, 18944, gated=True) is None
    capturing[0] = True
    assert skinny_gemm.tiles_for(cuda, 8, 4608, 3584) == Tiles(64, 128, 4, 4, 4)
    # the gated product has its own key (its time includes the activation): neither stands in for the other
    assert skinny_gemm.table_key(8, 3584, 18944, gated=True) == "16x3584x18944:silu"
    assert skinny_gemm.tiles_for(cuda, 8, 3584, 18944, gated=True) == Tiles(64, 256, 2, 4, 4)
    assert skinny_gemm.tiles_for(cuda, 8, 3584, 18944) is None
    assert skinny_gemm.tiles_for(cuda, 8, 4608, 3584, gated=True) is None
    assert skinny_gemm.tiles_for(cuda, 32, 3584, 18944, gated=True) is None
    assert skinny_gemm.tiles_for(cuda, 17, 4608, 3584) is None  # the 32-row bucket was not measured
    assert skinny_gemm.tiles_for(cuda, 8, 3584, 3584) is None
    skinny_gemm.use_tiles("NVIDIA H200", {"32x4608x3584": [32, 256, 1, 4, 3]})
    assert skinny_gemm.tiles_for(cuda, 17, 4608, 3584) == Tiles(32, 256, 1, 4, 3)


def test_committed_table_holds_tiles_the_kernel_takes(monkeypatch):
    """kernels/skinny_gemm_tiles.json (written by benchmarks/paged_h200.py on each GPU): every entry is a rows bucket
    and a product, and its tile runs right here (same kernel, smaller product: K slices of whole tiles)."""
    monkeypatch.setattr(skinny_gemm, "_measured", None)
    table = skinny_gemm._load()
    assert table, "kernels/skinny_gemm_tiles.json holds no GPU"
    for gpu, shapes in table.items():
        for key, tiles in shapes.items():
            product, gated = key.removesuffix(skinny_gemm.GATED_KEY), key.endswith(skinny_gemm.GATED_KEY)
            rows, n, k = map(int, product.split("x"))
            assert rows == skinny_gemm.rows_bucket(rows) and 0 < rows <= skinny_gemm.MAX_ROWS, (gpu, key)
            assert n > 0 and k >= tiles.block_k * tiles.split, (gpu, key, tiles)
            x, w, b = operands(rows // 2 + 1, tiles.block_n + 3, tiles.block_k * tiles.split)
            if gated:
                gate_up = torch.cat([x, x.flip(0)], dim=1)
                out = skinny_gemm.gated_linear(gate_up, w, b, tiles=tiles._replace(stages=1))
                assert_close(out, F.linear(reference.silu_mul_(gate_up.clone()), w, b))
            else:
                assert_close(skinny_gemm.linear(x, w, b, tiles=tiles._replace(stages=1)), F.linear(x, w, b))


def gate_up_rows(rows, n, k, dtype=torch.float32, bias=False):
    """A gated MLP's [gate | up] rows [rows, 2 x k] (gates spread to where silu bends) and a down weight [n, k]."""
    x, w, b = operands(rows, n, 2 * k, dtype=dtype, bias=bias)
    return (x.float() * 3).to(dtype), w[:, :k].contiguous(), b


def unfused(gate_up, w, b):
    """What a decode step ran before: silu_mul_ in place (torch's), then F.linear."""
    return F.linear(reference.silu_mul_(gate_up.clone()), w, b)


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40, 64])
@pytest.mark.parametrize("split", [1, 2, 4])
def test_gated_equals_silu_mul_then_f_linear(rows, split):
    gate_up, w, b = gate_up_rows(rows, 50, 128, bias=True)  # 128 = 4 tiles of 32: a slice each at split 4
    before = gate_up.clone()
    out = skinny_gemm.gated_linear(gate_up, w, b, tiles=Tiles(block_n=16, block_k=32, split=split, warps=4, stages=1))
    assert out.shape == (rows, 50)
    assert torch.equal(gate_up, before)  # read only: the activation is made on load
    torch.testing.assert_close(out, unfused(gate_up, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_gated_bfloat16_is_the_unfused_product_to_the_bit(split):
    """In bf16 the activation is rounded as silu_mul_ rounds it: with the same tile (the same summation order) the
    gated kernel gives silu_mul_'s kernel then linear's, bit for bit; against torch's, the GEMM's tolerance."""
    gate_up, w, b = gate_up_rows(8, 64, 128, dtype=torch.bfloat16, bias=True)
    tiles = Tiles(block_n=16, block_k=32, split=split, warps=4, stages=1)
    out = skinny_gemm.gated_linear(gate_up, w, b, tiles=tiles)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, skinny_gemm.linear(activation.silu_mul_(gate_up.clone()), w, b, tiles=tiles))
    ref = unfused(gate_up, w, b).float()
    assert (out.float() - ref).abs().max() <= 2 ** -6 * ref.abs().max()


@pytest.mark.parametrize("k", [40, 100])  # K not a multiple of the tile: the masked loads of gate and up
def test_gated_ragged_k(k):
    gate_up, w, _ = gate_up_rows(8, 33, k)
    out = skinny_gemm.gated_linear(gate_up, w, tiles=Tiles(block_n=16, block_k=32, split=2, warps=4, stages=1))
    torch.testing.assert_close(out, unfused(gate_up, w, None), rtol=1e-5, atol=1e-5)


def test_gated_rows_from_a_strided_view():
    """[gate | up] rows inside wider rows (and every other row of them): the row stride is not 2 x K."""
    gate_up, w, _ = gate_up_rows(12, 24, 64)
    wide = torch.cat([gate_up, torch.full((12, 16), float("nan"))], dim=1)[::2, :128]
    out = skinny_gemm.gated_linear(wide, w, tiles=Tiles(block_n=16, block_k=32, split=2, warps=4, stages=1))
    torch.testing.assert_close(out, unfused(gate_up[::2], w, None), rtol=1e-5, atol=1e-5)


def test_gated_without_a_tile_runs_silu_mul_then_linear_as_before(monkeypatch):
    """No tile for the gated product (a GPU without one, or an eager step): kernels.silu_mul_ in place, then linear,
    so the numbers are the two launches', bit for bit; the lookup asks for the gated key of the K it reads."""
    gate_up, w, b = gate_up_rows(6, 40, 96, dtype=torch.bfloat16, bias=True)
    asked = []

    def no_gated_tile(device, rows, n, k, gated=False):
        asked.append((rows, n, k, gated))
        return None if gated else skinny_gemm.INTERPRETER_TILES

    monkeypatch.setattr(skinny_gemm, "tiles_for", no_gated_tile)
    two_launches = gate_up.clone()
    want = skinny_gemm.linear(activation.silu_mul_(two_launches), w, b)
    asked.clear()
    out = skinny_gemm.gated_linear(gate_up, w, b)
    assert asked == [(6, 40, 96, True), (6, 40, 96, False)]
    assert torch.equal(out, want)
    assert torch.equal(gate_up, two_launches)  # the gate half overwritten, as silu_mul_ always did


def test_gated_on_the_cpu_without_triton_is_torchs_silu_mul_then_f_linear(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    gate_up, w, b = gate_up_rows(5, 24, 64, dtype=torch.bfloat16, bias=True)
    want = F.linear(reference.silu_mul_(gate_up.clone()), w, b)
    assert torch.equal(kernels.gated_linear(gate_up, w, b), want)


def test_gated_mlp_reads_its_gate_up_rows_through_the_gated_product():
    """The paged model's fused MLP under the interpreter (the gated kernel, CPU tile) against the torch path."""
    from harness.stacks.paged.layers import GatedMLP

    torch.manual_seed(0)
    mlp = GatedMLP(32, 96, bias=True)
    for p in mlp.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(7, 32)
    with torch.no_grad():
        want = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        mlp.fuse()
        torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5)
