"""pytest-benchmark, the real one: memcheck's metrics in its extra_info, and memcheck reports in its JSON format
read by its own `pytest-benchmark compare` and histogram tools."""
import json
import os
import subprocess
import sys

import pytest
import reportfactory as f

from memcheck.cli import main
from memcheck.metrics.catalog import METRICS
from memcheck.reports import exports
from memcheck.reports.report import merge

pytest.importorskip("pytest_benchmark")
COMPARE = os.path.join(os.path.dirname(sys.executable), "pytest-benchmark")


def _export(tmp_path, report, name: str) -> str:
    out = tmp_path / name
    assert main(["export", "--report", f.write(report, tmp_path / f"{name}.report.json"),
                 "--pytest-benchmark", str(out)]) == 0
    return str(out)


def test_every_measured_memory_and_time_metric_is_one_benchmark(tmp_path):
    merged, _ = merge([f.gpu_report(), f.cpu_report()])
    data = json.loads(open(_export(tmp_path, merged, "run.json")).read())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(data)
    got = {(b["name"], b["extra_info"]["metric"]): b for b in data["benchmarks"]}
    want = {(item.id, name) for item in merged.items for name, v in item.measurement.metrics.items()
            if v.value is not None and not METRICS[name].lower_is_worse}
    assert set(got) == want and want
    peak = got[("r1-distill-batch8[hf]", "gpu.heap_alloc.peak")]
    assert peak["group"] == "gpu.heap_alloc.peak (bytes)"
    assert peak["stats"]["min"] == peak["stats"]["max"] == peak["stats"]["mean"] == 18.3 * f.GiB
    assert peak["extra_info"]["verdict"] == "regressed" and peak["extra_info"]["device_class"] == "nvidia-h200"
    # null on the CPU runner: absent, never a 0
    assert ("tiny-dense-batch[hf]", "gpu.heap_alloc.peak") not in got


def test_rounds_become_the_benchmark_data():
    stats = exports._benchmark_stats([3.0, 1.0, 2.0, 10.0])
    assert stats["data"] == [3.0, 1.0, 2.0, 10.0] and stats["rounds"] == 4
    assert (stats["min"], stats["max"], stats["median"], stats["mean"]) == (1.0, 10.0, 2.5, 4.0)
    assert (stats["q1"], stats["q3"]) == (1.5, 6.5)


def test_pytest_benchmark_compare_and_histogram_read_memcheck_runs(tmp_path):
    before = _export(tmp_path, f.cpu_report(), "0001_before.json")
    after_report = f.cpu_report()
    after_report.items[0].measurement.metrics["cpu.heap_alloc.peak"].value = 12 * f.MiB
    after = _export(tmp_path, after_report, "0002_after.json")
    out = subprocess.run([COMPARE, "compare", before, after, "--time-unit", "s", "--columns", "min,max,mean",
                          "--histogram", str(tmp_path / "hist")], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "cpu.heap_alloc.peak (bytes)" in text and "tiny-dense-batch[hf]" in text
    assert "10,066,329.6" in text and "12,582,912.0" in text  # 9.6 MiB and 12 MiB, unscaled
    assert "Failed to load" not in out.stderr
    svgs = sorted(p.name for p in tmp_path.glob("hist*.svg"))
    assert any("cpu.heap_alloc.peak" in name for name in svgs), svgs


def test_a_test_using_benchmark_and_memcheck_saves_memory_in_extra_info(pytester, tmp_path):
    pytester.makepyfile(test_bench="""
        import torch

        def test_alloc(benchmark, memcheck):
            with memcheck():
                benchmark.pedantic(lambda: torch.ones(1024, 1024), rounds=2, iterations=1)
    """)
    out = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_bench.py", f"--benchmark-json={out}",
                                           "--benchmark-autosave", f"--benchmark-storage={tmp_path / 'store'}")
    assert result.ret == 0, result.stdout.str()
    bench = json.loads(out.read_text())["benchmarks"][0]
    assert bench["extra_info"]["memcheck.cpu.heap_alloc.peak"] >= 4 * 2**20  # one 4 MiB tensor live at a time
    assert bench["extra_info"]["memcheck.host.rss.peak"] > 0
    assert "memcheck.gpu.heap_alloc.peak" not in bench["extra_info"]  # null on a CPU runner: left out
    saved = list((tmp_path / "store").rglob("*.json"))
    assert saved and "memcheck.cpu.heap_alloc.peak" in json.loads(saved[0].read_text())["benchmarks"][0]["extra_info"]
