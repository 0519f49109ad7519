"""Every kernel compiles for the H200 (sm_90) through Triton's NVIDIA backend, on this CPU machine.

The interpreter runs the kernels' arithmetic but never lowers them: a kernel that the interpreter
accepts can still fail to compile for the GPU (a layout or type the backend rejects). The script
runs in a child process because this folder's kernels are defined under TRITON_INTERPRET."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kernels_ptx.py"


def test_every_kernel_compiles_to_sm90_ptx(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile for real, not from an earlier run's cache
    run = subprocess.run([sys.executable, str(SCRIPT), "--dump", str(tmp_path / "ptx")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = run.stdout.strip().splitlines()[1:]
    kernels = {row.split(":")[1].split()[0] for row in rows}
    assert kernels == {"_decode", "_prefill", "_prefill_hopper", "_mla_decode",
                       "_mla_decode_seesaw", "_mla_prefill",
                       "_mha_prefill", "_merge_window", "_gather_context", "combine_cut_units",
                       "_write_latent_rows", "_write_kv_rows", "_rotate_write_kv_rows", "_sort_picks", "_gate_up",
                       "_down", "_sum_picks",
                       "_router_logits", "_route",
                       "_rms_norm", "_rotary", "_silu_mul", "_linear"}, run.stdout
    for ptx in (tmp_path / "ptx").iterdir():
        assert ".target sm_90" in ptx.read_text(), ptx.name
    # memcheck/kernels/stamps.py's diagnostic: read in the launches that ask for it (decode, the seesaw, the Hopper prefill),
    # nowhere else
    stamped = sorted(p.name for p in (tmp_path / "ptx").iterdir() if "%globaltimer" in p.read_text())
    assert len(stamped) == 3 and all("time_stamps" in name for name in stamped), stamped
    # with each program's multiprocessor (%smid) in the decodes' stamps, not the prefill's
    placed = sorted(p.name for p in (tmp_path / "ptx").iterdir() if "%smid" in p.read_text())
    assert len(placed) == 2 and all("time_stamps" in name and "prefill" not in name for name in placed), placed
