"""benchmarks/at_size_h200.py: the references it times beside each grid cell (a CPU dry run through the interpreter),
and its verdict per family (synthetic rows)."""
import json
import os
import subprocess
import sys

from benchmarks import at_size_h200 as at
from benchmarks import kernels_h200 as kg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dry_run_times_each_cells_references_and_records_why_one_could_not_run(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "benchmarks/at_size_h200.py", "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "at_size_h200.json").read_text())["rows"]
    assert sorted(r["name"] for r in rows) == sorted(c.name for c in kg.all_cells(kg.DRY_GRID))
    for r in rows:
        decode = r["family"] in (kg.DECODE, kg.MLA_DECODE)
        assert ("read_ms" in r) == decode and ("read_config" in r) == decode
        assert ("cublas_ms" in r) == (r["family"] == kg.MLA_DECODE)
        if not decode:  # no cuDNN on the CPU: null with its reason, never a number
            assert "cudnn_ms" not in r and r["cudnn_error"]
    assert "fastest reference over it" in (tmp_path / "at_size_h200.log").read_text()


def test_the_verdict_counts_our_cells_at_the_goal_and_references_over_it(monkeypatch):
    lines = []
    monkeypatch.setattr(at, "log", lambda *parts: lines.append(" ".join(map(str, parts))))
    rows = [{"family": kg.DECODE, "name": "a", "floor_ms": 1.0, "ms": 1.05, "read_ms": 1.02},
            {"family": kg.DECODE, "name": "b", "floor_ms": 1.0, "ms": 1.9, "read_ms": 1.3},
            {"family": kg.DECODE, "name": "c", "floor_ms": 1.0, "ms": 1.5, "read_ms": 1.2, "cublas_ms": None},
            {"family": kg.PREFILL, "name": "d", "floor_ms": 1.0, "ms": 1.6, "cudnn_error": "refused"}]
    at.report(rows, {"one_kernel_us": 2.0, "two_kernels_us": 4.0})
    verdict = {line[:26].strip(): line[26:] for line in lines if " cells: " in line}
    assert verdict[kg.DECODE].split() == "3 cells: ours at the goal 1; fastest reference over it 2 (worst 1.30x, b)".split()
    assert verdict[kg.PREFILL].split() == "1 cells: ours at the goal 0; fastest reference over it 0".split()
    assert set(verdict) == {kg.DECODE, kg.PREFILL}


def test_a_grid_json_it_cannot_read_is_a_one_line_error_naming_the_file(tmp_path):
    missing, rowless, fieldless = tmp_path / "none.json", tmp_path / "rowless.json", tmp_path / "fieldless.json"
    rowless.write_text(json.dumps({"env": {}}))
    fieldless.write_text(json.dumps({"rows": [{"family": kg.DECODE, "name": "GQA 28/4 b1 x 1K", "status": "ok"}]}))
    for path, why in ((rowless, "no field 'rows'"), (fieldless, "no field 'floor_ms'")):
        try:
            at.grid_rows(str(path), 10.0, kg.GRID)
        except SystemExit as e:
            assert str(e) == f"at_size_h200.py: --grid-json {path}: not a kernels_h200.py --grid JSON ({why})"
        else:
            raise AssertionError(f"{path} was read as a grid")
    done = subprocess.run([sys.executable, "benchmarks/at_size_h200.py", "--grid-json", str(missing), "--out",
                           str(tmp_path)], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"at_size_h200.py: --grid-json {missing}: not a kernels_h200.py --grid JSON ([Errno 2] No such file or "
        f"directory: '{missing}')"]
