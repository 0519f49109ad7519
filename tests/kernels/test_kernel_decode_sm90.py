"""Triton's dense decode (memcheck/kernels/decode.py) as the H200 would run it, on this CPU machine: four programs a
multiprocessor at every batch. Its grid is the programs the GPU holds at once, and at small batches the work phase
runs at the bandwidth its programs keep in flight: 149 registers a thread (3 programs a multiprocessor) where the
sequence lengths were summed over 16 lanes, 124-125 (4) from 32 (memcheck/kernels/decode.py's SEQS_PAD_LEAST). The time
stamps' build too (memcheck/kernels/stamps.py), so decode_timeline.py times the grid the decode runs: 155 registers at 32
lanes, 126-128 at its 64."""
import pytest

from kernel_helpers import compiled_in_a_child

pytest.importorskip("triton")
CHILD = """
import json, sys, torch
sys.path[:0] = [{root!r}, {scripts!r}]
import kernel_sass, kernels_ptx
from memcheck.kernels import decode, stamps
rows = {{}}
for heads, kv_heads, stamped in ((28, 4, False), (32, 32, False), (28, 4, True)):
    for seqs in (1, 256):
        config = {{"stamps": torch.zeros(64, stamps.SLOTS, dtype=torch.int64)}} if stamped else None
        table = torch.zeros(seqs, 8, dtype=torch.int32)
        lens = torch.full((seqs,), 40, dtype=torch.int32)
        k = torch.randn(24, 16, kv_heads, 128, dtype=torch.bfloat16)
        call = lambda: decode.paged_decode(torch.randn(seqs, heads, 128, dtype=torch.bfloat16), k, k, table, lens,
                                           0.088, num_programs=4, config=config)
        kernel, values, options = next(c for c in kernels_ptx.capture(call) if c[0].__name__ == "_decode")
        values["BLOCK_N"] = decode.DEFAULT_CONFIG["block_n"]  # the GPU's tiles (the CPU path takes 16)
        info, sass = kernel_sass.assemble(kernels_ptx.compile_kernel(kernel, values, options).asm["ptx"])
        rows[f"{{heads}}/{{kv_heads}} b{{seqs}}{{' stamped' if stamped else ''}}"] = {{**info, **kernel_sass.hot_loop(sass)}}
print(json.dumps(rows))
"""


def test_four_programs_a_multiprocessor_at_every_batch(tmp_path):
    rows = compiled_in_a_child(CHILD, tmp_path)
    assert len(rows) == 6, rows
    for case, row in rows.items():
        # 4 warps a program: 128 registers a thread or fewer is 4 x 16K of the 64K a multiprocessor has
        assert row["registers"] <= 128, (case, row)
        assert (row["spill_stores"], row["LDL"], row["STL"]) == (0, 0, 0), (case, row)
