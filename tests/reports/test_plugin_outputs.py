"""What `pytest --memcheck` writes at the end of a session (JSON, Markdown, HTML, OpenMetrics, benchmark JSON,
Bencher JSON, JUnit properties, the GitHub job summary), and its xdist support."""
import json
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import reportfactory as f

from memcheck.plugin import MemcheckSession, pin_xdist_worker
from memcheck.reports.report import Report

pytest_plugins = ["pytester"]

TINY = """\
name: tiny
model: {preset: r1-distill-qwen-7b, layers: 1, hidden_size: 64, intermediate_size: 128, num_attention_heads: 2,
        num_key_value_heads: 1, vocab_size: 128}
requests: [{count: 2, prompt_tokens: 8, max_new_tokens: 4}]
stacks: [hf]
"""


def test_one_session_writes_every_report(pytester, monkeypatch):
    pytester.makefile(".yaml", tiny=TINY)
    pytester.makefile(".toml", pyproject="[tool.memcheck]\n")
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memcheck", "tiny.yaml", "--memcheck-device", "cpu",
                                           "--memcheck-no-host-heap", "--memcheck-report", "out/r.json",
                                "--memcheck-markdown", "out/r.md", "--memcheck-html", "out/r.html",
                                "--memcheck-openmetrics", "out/metrics.txt", "--memcheck-benchmark-json", "out/b.json",
                                "--memcheck-bencher", "out/bmf.json", "--junitxml", "out/junit.xml")
    assert result.ret == 0, result.stdout.str()
    out = pytester.path / "out"
    report = Report.load(str(out / "r.json"))
    assert [r.id for r in report.items] == ["tiny[hf]"] and report.items[0].measurement.timeline
    assert (out / "r.md").read_text().startswith("<!-- memcheck-report -->")
    page = (out / "r.html").read_text()
    assert "<svg" in page and "Host memory (resident set of the worker process)" in page
    assert 'memcheck_host_rss_peak_bytes{workload="tiny",stack="hf",device_class="' in (out / "metrics.txt").read_text()
    assert any(e["name"].startswith("tiny[hf] host.rss.peak") for e in json.loads((out / "b.json").read_text()))
    assert "host-rss-peak" in json.loads((out / "bmf.json").read_text())["tiny[hf]"]
    assert summary.read_text().startswith("## memcheck: ✅ no regression")
    # JUnit: the verdict and every checked metric as properties of the test case
    case = next(ET.parse(out / "junit.xml").iter("testcase"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert case.get("name") == "tiny[hf]"
    assert props["memcheck.verdict"] == "new"
    assert float(props["memcheck.host.rss.peak"]) > 0 and float(props["memcheck.cpu.heap_alloc.peak"]) > 0


def test_xdist_worker_hands_its_results_to_the_controller():
    worker = SimpleNamespace(config=SimpleNamespace(workeroutput={}), report=f.gpu_report())
    MemcheckSession.pytest_sessionfinish(worker, session=None)  # writes no file: it is a worker
    controller = SimpleNamespace(report=f.cpu_report())
    node = SimpleNamespace(workeroutput=worker.config.workeroutput)
    MemcheckSession.pytest_testnodedown(controller, node, error=None)
    assert [r.id for r in controller.report.items] == ["tiny-dense-batch[hf]"] + [r.id for r in f.gpu_report().items]
    MemcheckSession.pytest_testnodedown(controller, SimpleNamespace(workeroutput={}), error="crashed")  # no data


def test_xdist_workers_are_pinned_to_their_own_gpu():
    env = {"PYTEST_XDIST_WORKER": "gw2", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert pin_xdist_worker(env) == "2" and env["CUDA_VISIBLE_DEVICES"] == "2"
    env = {"PYTEST_XDIST_WORKER": "gw5", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert pin_xdist_worker(env) == "6"  # more workers than GPUs: round robin
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert pin_xdist_worker(env, device_count=lambda: 8) == "1"
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert pin_xdist_worker(env, device_count=lambda: 0) is None and "CUDA_VISIBLE_DEVICES" not in env  # CPU runner
    assert pin_xdist_worker({}) is None  # not under xdist
