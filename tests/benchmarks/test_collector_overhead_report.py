"""benchmarks/collector_overhead.py's memory column: an exact metric that moved from its baseline is named with
both values and every round's, so a GPU run shows how far it moved and whether the rounds agree."""
from types import SimpleNamespace

from benchmarks import collector_overhead as co
from memcheck.metrics.value import MetricValue


def test_a_moved_exact_metric_is_shown_with_its_values():
    common = {"kv.page_footprint": 8, "host.rss.peak": 100, "host.page_faults": 10, "gpu.reserved.peak": 4096}
    baseline = SimpleNamespace(metrics={n: MetricValue(v) for n, v in {**common, "gpu.heap_alloc.peak": 1000}.items()})
    runs = [SimpleNamespace(metrics={n: MetricValue(v) for n, v in {**common, "gpu.heap_alloc.peak": peak}.items()})
            for peak in (1512, 1512)]
    text = co._memory_vs_baseline(runs, baseline)
    assert text.startswith("exact 1/2 (differ: gpu.heap_alloc.peak 1000 -> 1512/1512)"), text
    assert "pages 8->8" in text and "rss +0.0%" in text


def test_exact_metrics_that_match_say_so_alone():
    same = {"kv.page_footprint": 8, "host.rss.peak": 100, "host.page_faults": 10, "gpu.heap_alloc.peak": 1000}
    baseline = SimpleNamespace(metrics={n: MetricValue(v) for n, v in same.items()})
    runs = [SimpleNamespace(metrics={n: MetricValue(v) for n, v in same.items()})]
    assert co._memory_vs_baseline(runs, baseline).startswith("exact 1/1, pages")
