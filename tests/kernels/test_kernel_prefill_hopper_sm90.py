"""The Gluon prefill (memcheck/kernels/prefill_hopper.py) as the H200 would run it, on this CPU machine: both forms (dense over
the paged cache, decompressed MLA over contiguous keys) issue every product on the tensor cores and keep their tile
loops nearly free of local memory. The interpreter cannot run Gluon, so the GPU's answers are checked by
benchmarks/prefill_hopper_h200.py; this checks the code ptxas makes of it, in a child process because this folder's
kernels are defined under TRITON_INTERPRET."""
import pytest

from kernel_helpers import compiled_in_a_child

pytest.importorskip("triton.experimental.gluon")
CHILD = """
import json, sys, torch
sys.path[:0] = [{root!r}, {scripts!r}]
import kernel_sass, kernels_ptx
from memcheck.kernels import prefill_hopper
bf16 = torch.bfloat16
cu_q, table = torch.tensor([0, 60, 97], dtype=torch.int32), torch.zeros(2, 8, dtype=torch.int32)
lens = torch.tensor([100, 37], dtype=torch.int32)
cache = torch.randn(24, 16, 4, 128, dtype=bf16)
q = torch.randn(97, 16, 192, dtype=bf16)  # the stack's q: nope and rope views of one projection
latent = torch.randn(137, 576, dtype=bf16)
calls = {{
    "dense": lambda: prefill_hopper.paged_prefill_hopper(torch.randn(97, 28, 128, dtype=bf16), cache, cache.clone(),
                                                         table, cu_q, lens, 0.1, (28, 2, 1), 0,
                                                         torch.empty(97, 28, 128, dtype=bf16)),
    "mla": lambda: prefill_hopper.mla_prefill_hopper(q[..., :128], q[..., 128:], torch.randn(137, 16, 256, dtype=bf16),
                                                     latent[:, 512:], cu_q, torch.tensor([0, 100, 137]), 0.1,
                                                     (16, 2, 1), 0, torch.empty(97, 16, 128, dtype=bf16)),
}}
rows = {{}}
for name, call in calls.items():
    kernel, values, options = kernels_ptx.capture(call)[0]
    info, sass = kernel_sass.assemble(kernels_ptx.compile_kernel(kernel, values, options).asm["ptx"])
    # the tile loop: a tile's scores and the last one's P x V (the smallest loop with both)
    rows[name] = {{**info, **kernel_sass.hot_loop(sass, min_mma=16), "HGMMA": sass.count("HGMMA")}}
print(json.dumps(rows))
"""


def test_every_product_on_the_tensor_cores_and_the_tile_loops_nearly_spill_free(tmp_path):
    """Per consumer: the first tile's scores, then a loop of scores and the last tile's P x V, then the last P x V
    (dense 8 products of k16 each, MLA's scores 8 nope + 4 rope). Each consumer has 240 registers a thread; the tile
    loop found has at most 4 local loads and stores a tile, and the whole kernel at most 256 bytes of spill stores and
    of loads (dense 76 and 56, MLA 176 and 224 as measured on the H200; the second consumer at 200 registers
    spills 404 and 400): ptxas spilling more is a regression to measure before it lands."""
    rows = compiled_in_a_child(CHILD, tmp_path)
    assert rows["dense"]["HGMMA"] == 2 * (8 + 8 + 8 + 8), rows["dense"]
    assert rows["mla"]["HGMMA"] == 2 * (12 + 12 + 8 + 8), rows["mla"]
    for name, row in rows.items():
        assert row["mma"] in (16, 20) and row["LDL"] <= 4 and row["STL"] <= 4, (name, row)
        assert row["spill_stores"] <= 256 and row["spill_loads"] <= 256, (name, row)
