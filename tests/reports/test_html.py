"""The HTML report: one self-contained file, a plot per workload for every stack, escaping."""
import re
from html.parser import HTMLParser

import reportfactory as f

from memcheck.reports import html
from memcheck.reports.report import merge


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(page: str) -> _Collect:
    p = _Collect()
    p.feed(page)
    return p


def test_self_contained_with_a_plot_per_workload_and_stack(tmp_path):
    merged, _ = merge([f.gpu_report(), f.cpu_report()])
    path = tmp_path / "report.html"
    html.write(merged, str(path))
    page = path.read_text()
    parsed = _parse(page)
    tags = [t for t, _ in parsed.tags]
    assert "script" not in tags
    # nothing is fetched: no external stylesheet, image, font or frame
    for tag, attrs in parsed.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed")
        assert not str(attrs.get("src", "")).startswith("http")
    assert "default-src 'none'" in page
    # GPU workload: allocated and reserved of both stacks that ran; the skipped vllm stack has no line
    gpu = page[page.index('id="r1-distill-batch8"'):page.index('id="deepseek-v2-lite-32k"')]
    assert gpu.count("<svg") == 2  # GPU memory and KV cache panels
    assert "GPU memory (torch allocator)" in gpu
    for stack in ("hf", "paged"):
        for series in ("allocated", "reserved"):
            assert f"<title>{stack}: {series}</title>" in gpu
    assert "<title>vllm" not in gpu
    # CPU workload: the worker's RSS
    cpu = page[page.index('id="tiny-dense-batch"'):]
    assert "Host memory (resident set of the worker process)" in cpu
    # verdict table, failing first; environment of both device classes
    verdicts = page[page.index('id="verdicts"'):page.index('id="tiny-dense-batch"')]
    order = re.findall(r'<td class="item"><a href="[^"]*"><code>([^<]+)</code>', verdicts)
    assert order[:2] == ["r1-distill-batch8[hf]", "deepseek-v2-lite-32k[hf]"]
    assert "<code>nvidia-h200</code>" in page and "<code>cpu-x86_64</code>" in page
    assert 'href="memcheck-snapshots/r1-distill-batch8-hf.pickle"' in page


def test_hostile_names_render_as_text():
    page = html.render(f.hostile_report(), artifact_url="javascript:alert(1)")
    parsed = _parse(page)
    assert not [t for t, _ in parsed.tags if t in ("img", "script")]
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<img" not in page
    assert f.HOSTILE + "[hf]" in "".join(parsed.text)  # what a reader sees: the name, as typed
    assert 'href="javascript' not in page


def test_item_without_timeline_says_so():
    page = html.render(f.gpu_report())
    section = page[page.index('id="deepseek-v2-lite-32k"'):]
    assert "No memory-over-time chart" in section


def test_metrics_a_cpu_runner_cannot_measure_are_one_line_not_rows():
    page = html.render(f.cpu_report())
    section = page[page.index('id="tiny-dense-batch"'):]
    assert "Not measured here (no CUDA device on this runner): <code>gpu." in section
    rows = re.findall(r'<td class="metric"><code>([^<]+)</code>', section)
    assert rows and not [m for m in rows if m.startswith("gpu.")], rows
    assert re.search(r"\d+ metric checks, \d+ not measured here</summary>", section)


def test_a_timeline_of_one_sample_draws_no_chart():
    """A fixture block samples once: one point is no curve, so its workload says it has no samples."""
    report = f.cpu_report()
    for item in report.items:
        item.measurement.timeline = item.measurement.timeline[:1]
    page = html.render(report)
    section = page[page.index('id="tiny-dense-batch"'):]
    assert "<svg" not in section and "No memory-over-time chart" in section
