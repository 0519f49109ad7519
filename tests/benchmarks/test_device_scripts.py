"""The device-call scripts built on benchmarks/kernels_h200.py, started on a machine without a CUDA GPU (or given a
bad count): one line naming the script, never a traceback from inside torch."""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(script, *args):
    return subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this runner has a CUDA GPU")
@pytest.mark.parametrize("script, dry_run_hint", [
    ("kernels_h200.py", True), ("at_size_h200.py", True), ("flush_ab_h200.py", False), ("mla_hopper_h200.py", False),
    ("prefill_hopper_h200.py", False), ("combine_sweep_h200.py", False), ("mla_grid_h200.py", True)])
def test_a_device_script_without_a_gpu_says_so_in_one_line(script, dry_run_hint, tmp_path):
    args = ["--out", str(tmp_path)]
    if script == "at_size_h200.py":  # a grid JSON it can read, with no cells: the GPU is what is missing
        (tmp_path / "grid.json").write_text(json.dumps({"rows": []}))
        args += ["--grid-json", str(tmp_path / "grid.json")]
    done = run(script, *args)
    hint = " (--dry-run runs on the CPU)" if dry_run_hint else ""
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    expected = f"{script}: needs a CUDA GPU; torch {torch.__version__} sees none{hint}"
    assert done.stderr.strip().splitlines() == [expected]


def test_flush_ab_refuses_fewer_than_one_round():
    done = run("flush_ab_h200.py", "--rounds", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "flush_ab_h200.py: error: --rounds 0: at least 1"
