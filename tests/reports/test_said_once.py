"""A report says each thing once: skipped items grouped by reason, a bump every item was compared across above the
table, metrics no item could judge or measure listed once; a regression across a package bump ends with the bisect
command; the baseline's curve under today's in the HTML."""
from html import unescape

from memcheck.baselines import BaselineStore
from memcheck.measurement import Measurement
from memcheck.reports import html, markdown
from memcheck.reports.report import Report
from memcheck.timeline import POINTS, downsample
from memcheck.verdict import judge

import reportfactory as f

def cpu_item(name, scale=None):
    m = f.measurement(name, "hf", f.CPU_ENV, {"cpu.heap_alloc.peak": 4 * f.MiB, "host.rss.peak": 300 * f.MiB,
                                               "kv.bytes.peak": f.MiB, "kv.waste.peak": 0.0})
    base = f.baseline(m, scale or {})  # recorded under transformers 5.17.0
    m.environment["transformers"] = "5.21.0"
    return judge(m, f.rules(), base)


def test_skipped_items_are_one_line_per_reason_and_not_rows():
    skipped = [judge(Measurement(f"w{i}", "vllm", "s.yaml", "ci", skipped="vllm is not installed on this runner"),
                     f.rules(), None) for i in range(3)]
    body = markdown.render(Report([cpu_item("a"), *skipped]))
    assert "⏭️ 3 items skipped: vllm is not installed on this runner (`w0[vllm]`, `w1[vllm]`, `w2[vllm]`)" in body
    assert "| `w0[vllm]`" not in body and body.count("vllm is not installed") == 1


def test_a_bump_every_item_shares_is_said_once_and_a_regression_says_how_to_bisect_it():
    regressed, passed = cpu_item("a", {"cpu.heap_alloc.peak": 2.0}), cpu_item("b")
    assert regressed.verdict == "regressed" and passed.verdict == "pass"
    body = markdown.render(Report([regressed, passed]))
    assert body.count("transformers 5.17.0 -&gt; 5.21.0") == 2  # once above the table, once in the regression's reason
    assert "Compared across (every item): transformers 5.17.0 -&gt; 5.21.0." in body
    command = "memcheck bisect 'a[hf]' --package transformers --good 5.17.0 --bad 5.21.0"
    assert f"`{command}`" in body and "'b[hf]'" not in body
    assert command in unescape(html.render(Report([regressed, passed])))


def test_metrics_no_item_judges_or_measures_are_listed_once_not_per_table():
    body = markdown.render(Report([cpu_item("a"), cpu_item("b")]))
    assert body.count("no CUDA device on this runner") == 1
    assert "Not measured on this runner (no CUDA device on this runner): `gpu.alloc_retries`" in body
    assert "| `gpu.heap_alloc.peak`" not in body


def test_a_baseline_keeps_its_timeline_downsampled_and_the_html_draws_it_under_todays(tmp_path):
    long = [{"t": s * 0.1, "step": s, "host.rss": 2**28 + s * 4096, "kv.bytes": 2**20 + 64 * s} for s in range(500)]
    kept = downsample(long)
    assert POINTS <= len(kept) <= POINTS + 2 and kept[0]["step"] == 0 and kept[-1]["step"] == 499
    assert max(p["host.rss"] for p in kept) == long[-1]["host.rss"] and "t" not in kept[0]
    m = f.measurement("a", "hf", f.CPU_ENV, {"host.rss.peak": 300 * f.MiB}, long)
    path, _ = BaselineStore(tmp_path).write(m)
    assert len(path.read_text()) < 12_000
    stored = BaselineStore(tmp_path).load("cpu-x86_64", "a", "hf")
    today = f.measurement("a", "hf", f.CPU_ENV, {"host.rss.peak": 300 * f.MiB}, f.cpu_timeline(20, 2**28))
    page = html.render(Report([judge(today, f.rules(), stored)]))
    assert "RSS, baseline" in page and 'stroke-opacity="0.3"' in page
    assert "Faded: the baseline&#39;s curves" in page and "commit 0123456789" in page
