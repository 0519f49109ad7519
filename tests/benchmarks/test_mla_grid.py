"""benchmarks/mla_grid_h200.py on the CPU: its cells, the band each falls in, and the verdict per band."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
sys.path.insert(0, BENCH)
import kernel_bench as kb  # noqa: E402
import mla_grid_h200 as grid  # noqa: E402
from mla_hopper_h200 import cell  # noqa: E402


def test_the_grid_covers_the_range_and_names_what_it_leaves_out():
    cells, left_out = grid.grid_cells()
    assert len(cells) + len(left_out) == 4 * 5 * 5 * 2
    assert {c.name for c in left_out} == {f"MLA {h}h b256 x 128K{b}" for h in grid.HEADS
                                          for b in ("", ", blocks of 64")}  # 38.7 GB a layer
    assert {c.block_size for c in cells} == {16, 64} and {c.q_heads for c in cells} == set(grid.HEADS)


@pytest.mark.parametrize("name,expected", [
    ("16h:b1x128K", ">= 128 MB"),  # 151 MB of latent cache
    ("64h:b8x1K", "< 128 MB"),
    ("128h:b32x4K/64", "compute-bound"),  # 242 FLOP a byte against the H200's ~185
])
def test_a_cell_falls_in_the_band_its_bytes_and_flops_put_it(name, expected):
    assert grid.band(cell(name), kb.H200_COPY_BPS, kb.H200_MM_FLOPS)[0] == expected


def test_a_cell_is_judged_against_its_bands_reference_and_the_worst_per_band_is_named():
    rows = [grid.judge({"cell": "a", "cache_mb": 151.0, "band": ">= 128 MB", "copy_floor_us": 100.0, "compute_floor_us": 10.0,
                        "read_us": 90.0, "ours_us": 109.0}),
            grid.judge({"cell": "b", "cache_mb": 302.0, "band": ">= 128 MB", "copy_floor_us": 100.0, "compute_floor_us": 10.0,
                        "read_us": 90.0, "ours_us": 130.0}),
            grid.judge({"cell": "c", "cache_mb": 9.0, "band": "< 128 MB", "copy_floor_us": 5.0, "compute_floor_us": 1.0,
                        "read_us": 10.0, "ours_us": 11.0}),  # 2.2x the floor, 1.1x the read: met
            grid.judge({"cell": "d", "cache_mb": 604.0, "band": "compute-bound", "copy_floor_us": 5.0, "compute_floor_us": 20.0,
                        "error": "OutOfMemoryError: ..."})]
    assert [r.get("met") for r in rows] == [True, False, True, None]
    worst = {r[0]: r[2:] for r in grid.worst_rows(rows)[1:]}
    assert worst == {">= 128 MB": ("2", "1", "b", "1.30"), "< 128 MB": ("1", "1", "c", "1.10"),
                     "compute-bound": ("0", "0", "-", "-")}
    assert "OutOfMemoryError" in grid.table(grid.cell_rows(rows))


def test_a_cell_name_takes_a_block_size():
    c = cell("16h:b8x4K/64")
    assert (c.q_heads, c.batch, c.context, c.block_size) == (16, 8, 4096, 64)
    assert c.name == "MLA 16h b8 x 4K, blocks of 64" and cell("16h:b8x4K").name == "MLA 16h b8 x 4K"


def test_the_dry_run_lists_the_cells_on_the_cpu():
    root = os.path.dirname(BENCH)
    done = subprocess.run([sys.executable, "benchmarks/mla_grid_h200.py", "--dry-run", "--heads", "16"], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "48 cells; left out for their size: MLA 16h b256 x 128K, MLA 16h b256 x 128K, blocks of 64" in done.stdout


def test_calls_result_files_join_into_one_grid(tmp_path, capsys):
    def result(name, *rows):
        path = tmp_path / name
        path.write_text(json.dumps({"device": "NVIDIA H200", "cells": [grid.judge(dict(r)) for r in rows]}))
        return str(path)

    row = {"cell": "a", "cache_mb": 151.0, "band": ">= 128 MB", "copy_floor_us": 100.0, "compute_floor_us": 10.0,
           "read_us": 90.0, "ours_us": 140.0}
    first = result("first.json", row, {**row, "cell": "b", "ours_us": 120.0})
    second = result("second.json", {**row, "ours_us": 108.0}, {**row, "cell": "c", "ours_us": 105.0})
    assert grid.join([first, second]) == 0
    out = capsys.readouterr().out
    assert "3 cells from 2 files on NVIDIA H200" in out
    large = next(line for line in out.splitlines() if line.startswith(">= 128 MB"))
    assert large.split()[-4:] == ["3", "2", "b", "1.20"]  # a's second call (1.08x) replaced its first (1.40x)
    (tmp_path / "other.json").write_text("{}")
    assert grid.join([first, str(tmp_path / "other.json")]) == 2
    assert "other.json: not a result of this script" in capsys.readouterr().err
    (tmp_path / "rowless.json").write_text(json.dumps({"device": "NVIDIA H200", "cells": [{"cell": "a"}]}))
    assert grid.join([str(tmp_path / "rowless.json")]) == 2
    assert "rowless.json: not a result of this script (ValueError: cell 'a': no cache_mb" in capsys.readouterr().err
