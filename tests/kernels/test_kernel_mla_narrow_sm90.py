"""The Gluon MLA decode for 32 heads or fewer (memcheck/kernels/mla_narrow.py) as the H200 would run it, on this CPU
machine: its tile loop's products and registers. The interpreter cannot run Gluon: tests/gpu checks its answers on a
GPU; this checks the code ptxas makes of it, in a child process because this folder's kernels are defined under
TRITON_INTERPRET."""
import pytest
from kernel_helpers import compiled_in_a_child

pytest.importorskip("triton.experimental.gluon")


NARROW_CHILD = """
import json, sys, torch
sys.path[:0] = [{root!r}, {scripts!r}]
import kernel_sass, kernels_ptx
from memcheck.kernels import mla_narrow, mla_seesaw
rows = {{}}
# 16 heads (V2-Lite; V2/V3 over 8 ranks), 32 (over 4), 8 (a warpgroup's 16 columns, half masked); cp.async: blocks with
# a gap after each, which TMA cannot copy a box each
for heads, tma in ((16, True), (32, True), (8, True), (16, False)):
    q = torch.randn(3, heads, 512, dtype=torch.bfloat16)
    cache = torch.randn(24, 16 if tma else 17, 576, dtype=torch.bfloat16)[:, :16]
    assert mla_seesaw.tma_loads_fit(cache) == tma
    call = lambda: mla_narrow.mla_decode_narrow(q, torch.randn(3, heads, 64, dtype=torch.bfloat16), cache,
                                                torch.zeros(3, 8, dtype=torch.int32),
                                                torch.full((3,), 100, dtype=torch.int32),
                                                0.1, torch.empty_like(q), min_tiles=2, num_programs=4)
    kernel, values, options = next(c for c in kernels_ptx.capture(call) if c[0].__name__ == "_mla_decode_narrow")
    compiled = kernels_ptx.compile_kernel(kernel, values, options)
    info, sass = kernel_sass.assemble(compiled.asm["ptx"])
    loops = [(loop["mma"], loop["LDL"], loop["STL"]) for loop in kernel_sass.tile_loops(sass, 60)]
    rows[f"{{heads}} {{'tma' if tma else 'cp.async'}}"] = {{**info, "HGMMA": sass.count("HGMMA"), "tile_loops": loops,
                                                            "shared": compiled.metadata.shared}}
# with stamps.py's diagnostic on: its six timed slots (the first tile's two among them) compile for the GPU too
stamps = torch.zeros(4 * mla_narrow.SLOTS, dtype=torch.int64)
call = lambda: mla_narrow.mla_decode_narrow(q, torch.randn(3, 16, 64, dtype=torch.bfloat16), cache,
                                            torch.zeros(3, 8, dtype=torch.int32),
                                            torch.full((3,), 100, dtype=torch.int32), 0.1, torch.empty_like(q),
                                            min_tiles=2, num_programs=4, stamps=stamps)
q = torch.randn(3, 16, 512, dtype=torch.bfloat16)
kernel, values, options = next(c for c in kernels_ptx.capture(call) if c[0].__name__ == "_mla_decode_narrow")
rows["stamped"] = {{"timers": kernels_ptx.compile_kernel(kernel, values, options).asm["ptx"].count("%globaltimer")}}
print(json.dumps(rows))
"""


def test_the_narrow_decode_runs_its_heads_products_only_in_registers(tmp_path):
    """One tile loop of 68 products: the scores' 36 (K = 512 + 64 in steps of 16, the heads as N) and P x V's 32 (the
    512 latent columns as M, 8 blocks of 64, K = 64 tokens), with no local memory; 32 heads on two warpgroups (one
    would hold a 128-register accumulator and spill in the loop); shared memory within the H200's 227 KiB a program."""
    rows = compiled_in_a_child(NARROW_CHILD, tmp_path)
    assert sorted(rows) == ["16 cp.async", "16 tma", "32 tma", "8 tma", "stamped"], rows
    assert rows.pop("stamped") == {"timers": 6}, rows
    for build, row in rows.items():
        assert row["HGMMA"] == 68 and row["tile_loops"] == [[68, 0, 0]], (build, row)
        assert row["spill_stores"] == 0 and row["shared"] <= 227 * 1024, (build, row)
