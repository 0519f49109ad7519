"""The bisect's search and its range: the first bad point found in few probes, skips gone around, no answer
claimed where skips leave it open."""
import pytest

from memcheck.bisect.releases import between
from memcheck.bisect.search import BAD, GOOD, SKIP, bisect
from memcheck.errors import UsageError

POINTS = [f"v{i}" for i in range(17)]


def prober(first_bad: int, skipped=()):
    probed = []

    def probe(point):
        probed.append(point)
        i = POINTS.index(point)
        return SKIP if i in skipped else (BAD if i >= first_bad else GOOD)
    return probe, probed


@pytest.mark.parametrize("first_bad", range(1, 17))
def test_the_first_bad_point_in_log2_probes(first_bad):
    probe, probed = prober(first_bad)
    out = bisect(POINTS, probe)
    assert out.first_bad == f"v{first_bad}" and not out.could_be
    assert len(probed) <= 2 + 4 and len(set(probed)) == len(probed)


def test_a_range_whose_bad_end_is_not_regressed_holds_no_regression():
    probe, probed = prober(first_bad=99)
    out = bisect(POINTS, probe)
    assert out.first_bad is None and not out.could_be and probed == ["v0", "v16"]


def test_a_skipped_point_is_gone_around():
    probe, probed = prober(first_bad=8, skipped={4, 9})
    assert bisect(POINTS, probe).first_bad == "v8"
    assert "v4" in probed  # probed, found unrunnable, and its neighbours tried instead


def test_only_skips_between_the_last_good_and_the_first_bad_leave_every_candidate():
    probe, _ = prober(first_bad=5, skipped={3, 4})
    out = bisect(POINTS, probe)
    assert out.first_bad is None and out.could_be == ["v3", "v4", "v5"]


def test_a_good_point_that_is_not_good_is_refused():
    with pytest.raises(ValueError, match="v0 is skip"):
        bisect(POINTS, prober(first_bad=3, skipped={0})[0])


def test_the_releases_between_two_versions_in_order_without_pre_releases():
    listed = ["5.25.0", "5.21.0", "5.21.0rc1", "5.20.2", "5.3.0", "5.20.10", "junk", "5.19.0"]
    assert between(listed, "5.19.0", "5.25.0") == ["5.19.0", "5.20.2", "5.20.10", "5.21.0", "5.25.0"]
    assert between(listed, "5.20.2", "5.21.0rc2") == ["5.20.2", "5.20.10", "5.21.0rc1", "5.21.0rc2"]
    with pytest.raises(UsageError, match="not older than"):
        between(listed, "5.25.0", "5.19.0")
    with pytest.raises(UsageError, match="not a version"):
        between(listed, "five", "5.19.0")
