"""The Gluon MLA decode (memcheck/kernels/mla_seesaw.py) as the H200 would run it, on this CPU machine: its tile loops keep
every value in registers (it sits at ptxas's 255-register edge, where a spill costs 1.3-1.7x the time). The interpreter
cannot run Gluon: tests/gpu checks its answers on a GPU; this checks the code ptxas makes of it, in a child process
because this folder's kernels are defined under TRITON_INTERPRET."""
import subprocess
import sys

import pytest
from kernel_helpers import ROOT, compiled_in_a_child

pytest.importorskip("triton.experimental.gluon")


SEESAW_CHILD = """
import json, sys, torch
sys.path[:0] = [{root!r}, {scripts!r}]
import kernel_sass, kernels_ptx
from memcheck.kernels import mla_seesaw
rows = {{}}
# 16: one block, 48 rows masked (V2-Lite); cp.async: blocks with a gap after each, which TMA cannot copy a box each
for heads, tma in ((128, True), (16, True), (128, False)):
    q = torch.randn(3, heads, 512, dtype=torch.bfloat16)
    cache = torch.randn(24, 16 if tma else 17, 576, dtype=torch.bfloat16)[:, :16]
    assert mla_seesaw.tma_loads_fit(cache) == tma
    call = lambda: mla_seesaw.mla_decode_seesaw(q, torch.randn(3, heads, 64, dtype=torch.bfloat16), cache,
                                                torch.zeros(3, 8, dtype=torch.int32),
                                                torch.full((3,), 100, dtype=torch.int32),
                                                0.1, torch.empty_like(q), min_tiles=2, num_programs=4)
    kernel, values, options = next(c for c in kernels_ptx.capture(call) if c[0].__name__ == "_mla_decode_seesaw")
    info, sass = kernel_sass.assemble(kernels_ptx.compile_kernel(kernel, values, options).asm["ptx"])
    loops = [(loop["mma"], loop["LDL"], loop["STL"]) for loop in kernel_sass.tile_loops(sass, 44)]
    rows[f"{{heads}} {{'tma' if tma else 'cp.async'}}"] = {{**info, "HGMMA": sass.count("HGMMA"),
                                                                       "tile_loops": loops}}
print(json.dumps(rows))
"""


def test_the_seesaw_keeps_its_tile_loops_in_registers(tmp_path):
    """Both partitions' tile loops: 36 score products (n64) and 8 of P x V (n256: its half of both tiles) each, and no
    local memory in them (the scores' descriptors held across the loop spilled 1.2 KB: see mla_seesaw's z); the same
    with 16 heads, whose block masks its rows past the 16th, and with the tiles copied by cp.async only (a zeroing pass
    over TMA's rows past a sequence's end spilled 164 bytes, 7 local loads in the loop). Outside the loops, at most a
    few registers a segment spilled (12-16 bytes, ~6 local loads a segment)."""
    rows = compiled_in_a_child(SEESAW_CHILD, tmp_path)
    assert sorted(rows) == ["128 cp.async", "128 tma", "16 tma"], rows
    for build, row in rows.items():
        assert row["HGMMA"] == 88 and row["tile_loops"] == [[44, 0, 0], [44, 0, 0]], (build, row)
        assert row["spill_stores"] <= 32, (build, row)


def test_the_seesaw_protocol_model_check_passes():
    """scripts/seesaw_protocol_check.py: the partitions' waits and arrivals, as two threads over random segments."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "seesaw_protocol_check.py"), "--schedules", "100"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


PDL_CHILD = """
import json, sys, torch
sys.path[:0] = [{root!r}, {scripts!r}]
import kernels_ptx
from memcheck.kernels import mla_seesaw, work_split
rows = {{}}
for early in (False, True):  # an sm_90 GPU, or one before it
    mla_seesaw.launches_early = work_split.launches_early = lambda device, early=early: early
    q = torch.randn(3, 128, 512, dtype=torch.bfloat16)
    call = lambda: mla_seesaw.mla_decode_seesaw(q, torch.randn(3, 128, 64, dtype=torch.bfloat16),
                                                torch.randn(24, 16, 576, dtype=torch.bfloat16),
                                                torch.zeros(3, 8, dtype=torch.int32),
                                                torch.full((3,), 100, dtype=torch.int32),
                                                0.1, torch.empty_like(q), min_tiles=2, num_programs=4)
    for kernel, values, options in kernels_ptx.capture(call):
        ptx = kernels_ptx.compile_ptx(kernel, values, options)
        rows[f"{{kernel.__name__}} {{early}}"] = {{"launch_pdl": values.get("launch_pdl", False),
                                                 "waits": ptx.count("griddepcontrol.wait"),
                                                 "triggers": ptx.count("griddepcontrol.launch_dependents")}}
print(json.dumps(rows))
"""


def test_the_seesaw_and_its_combine_launch_early_and_wait_where_pdl_is_on(tmp_path):
    """On sm_90 the seesaw is launched with programmatic dependent launch and waits (griddepcontrol.wait, once a
    partition) before it reads the sequence lengths, the query or the cache, as the combine after it does. Neither
    signals its dependents early (dispatch.launches_early says why). Before sm_90: neither."""
    rows = compiled_in_a_child(PDL_CHILD, tmp_path)
    for name in ("_mla_decode_seesaw", "combine_cut_units"):
        assert rows[f"{name} True"]["launch_pdl"] and rows[f"{name} True"]["waits"] >= 1, rows
        assert not rows[f"{name} False"]["launch_pdl"] and rows[f"{name} False"]["waits"] == 0, rows
    assert rows["_mla_decode_seesaw True"]["waits"] == 2, rows  # one a partition
    assert all(row["triggers"] == 0 for row in rows.values()), rows
