import math

import pytest

from memcheck import rules
from memcheck.errors import UsageError
from memcheck.metrics.catalog import METRICS
from memcheck.metrics.value import MetricValue


def where(field, message):
    return UsageError(message, "test.yaml", field=field)


def check(metric, raw, now, base, samples_now=(), samples_base=()):
    rule = rules.parse(metric, raw, where)
    # A baseline measured by the metric's current definition (revisions: test_baselines.py).
    b = None if base is None else MetricValue(base, samples=list(samples_base), revision=METRICS[metric].revision)
    return rules.evaluate(rule, MetricValue(now, samples=list(samples_now)), b)


@pytest.mark.parametrize("now,status", [(100, "pass"), (101.9, "pass"), (102.1, "regressed"), (97.9, "improved")])
def test_relative(now, status):
    assert check("gpu.heap_alloc.peak", {"max_increase": "2%"}, now, 100).status == status


def test_absolute_size():
    assert check("gpu.heap_alloc.peak", {"max_increase": "1KiB"}, 1000 + 1025, 1000).status == "regressed"
    assert check("gpu.heap_alloc.peak", {"max_increase": "1KiB"}, 1000 + 1024, 1000).status == "pass"


def test_both_must_exceed():
    rule = {"max_increase": "5% and 1MiB"}
    # +10% but only 100 bytes: noise on a small value, not a regression
    assert check("host.rss.peak", rule, 1100, 1000).status == "pass"
    # +2 MiB but only 0.2%: within the relative part
    assert check("host.rss.peak", rule, 2**30 + 2 * 2**20, 2**30).status == "pass"
    assert check("host.rss.peak", rule, 2 * 2**20 + 2**20 + 1, 2 * 2**20).status == "regressed"


def test_ceiling_holds_without_baseline():
    c = check("kv.blocks_unreclaimed", {"max": 0}, 3, None)
    assert c.status == "regressed" and "ceiling" in c.message
    assert check("kv.blocks_unreclaimed", {"max": 0}, 0, None).status == "pass"


def test_floor_and_direction():
    assert check("tokens_per_s", {"min": 100}, 50, None).status == "regressed"
    worse = check("gpu.heap_alloc.peak", {"max_increase": "2%", "direction": "lower_is_worse"}, 90, 100)
    assert worse.status == "regressed"


def test_null_is_not_measured_with_reason():
    rule = rules.parse("host.dtlb_misses", {"max_increase": "5%"}, where)
    c = rules.evaluate(rule, MetricValue.null("no PMU counter"), MetricValue(10))
    assert c.status == "not_measured" and "no PMU counter" in c.message


def test_no_baseline_is_new():
    assert check("gpu.heap_alloc.peak", {"max_increase": "2%"}, 5, None).status == "new"


def test_band_needs_rounds():
    c = check("time.wall", {"band": 3}, 1.0, 1.0)
    assert c.status == "not_compared" and "rounds" in c.message


def test_band_from_rounds():
    base = [1.00, 1.02, 0.98]
    assert check("time.wall", {"band": 3}, 1.03, 1.0, [1.03, 1.04, 1.02], base).status == "pass"
    assert check("time.wall", {"band": 3}, 1.5, 1.0, [1.5, 1.52, 1.48], base).status == "regressed"
    assert check("tokens_per_s", {"band": 3}, 50, 100, [50, 51, 49], [100, 101, 99]).status == "regressed"


def test_message_names_baseline_now_delta_rule():
    c = check("gpu.heap_alloc.peak", {"max_increase": "2%"}, 2 * 2**30, 2**30)
    assert c.message == "baseline 1.00 GiB, now 2.00 GiB, +1.00 GiB (+100.00%), rule max_increase 2%"
    assert c.delta_rel == 1.0 and not math.isinf(c.delta_rel)


@pytest.mark.parametrize("raw,field", [
    ({"max_increase": "2 percent"}, "gpu.heap_alloc.peak.max_increase"),
    ({"max_increase": "-2%"}, "gpu.heap_alloc.peak.max_increase"),
    ({"max": "lots"}, "gpu.heap_alloc.peak.max"),
    ({"band": -1}, "gpu.heap_alloc.peak.band"),
    ({"direction": "up"}, "gpu.heap_alloc.peak.direction"),
    ({"maximum": 3}, "gpu.heap_alloc.peak.maximum"),
    ("2%", "gpu.heap_alloc.peak"),
])
def test_bad_rules_name_the_field(raw, field):
    with pytest.raises(UsageError) as e:
        rules.parse("gpu.heap_alloc.peak", raw, where)
    assert e.value.field == field


def test_unknown_metric():
    with pytest.raises(UsageError, match="unknown metric"):
        rules.parse("gpu.heap.peak", {"max": 1}, where)


def test_off_disables():
    assert rules.parse("gpu.heap_alloc.peak", "off", where) is None
