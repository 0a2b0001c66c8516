import math

import pytest

from specdeploy.decide.stats import band_from_spread, mad, median, ratio_with_band


def test_median_odd_even_and_unsorted():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_median_of_nothing_raises():
    with pytest.raises(ValueError):
        median([])


def test_mad_is_unscaled():
    # median 3; |x-3| = 2,1,0,1,97 -> median 1 (no 1.4826 factor), robust to the outlier
    assert mad([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0
    assert mad([5.0, 5.0, 5.0]) == 0.0


def test_speculation_faster_and_significant():
    base = [5.2, 5.3, 5.25, 5.22, 5.28]  # median 5.25, mad 0.03
    spec = [4.1, 4.2, 4.15, 4.12, 4.18]  # median 4.15, mad 0.03
    r = ratio_with_band(spec, base)
    assert r["ratio"] == pytest.approx(4.15 / 5.25)
    assert r["low"] == pytest.approx(4.12 / 5.28)
    assert r["high"] == pytest.approx(4.18 / 5.22)
    assert r["high"] < 1 and r["significant"] is True


def test_speculation_slower_is_significant_too():
    # the measured k=4 case: TPOT 8.6 ms against a 5.23 ms baseline
    base = [5.23, 5.20, 5.26, 5.21, 5.25]
    spec = [8.60, 8.50, 8.70, 8.55, 8.65]
    r = ratio_with_band(spec, base)
    assert r["ratio"] == pytest.approx(8.60 / 5.23)
    assert r["low"] > 1 and r["significant"] is True


def test_overlapping_arms_are_not_significant():
    base = [5.0, 5.5, 4.5, 5.2, 4.8]  # median 5.0, mad 0.2
    spec = [4.9, 5.4, 4.4, 5.1, 4.7]  # median 4.9, mad 0.2
    r = ratio_with_band(spec, base)
    assert r["low"] < 1 < r["high"]
    assert r["significant"] is False


def test_identical_constant_arms():
    r = ratio_with_band([2.0, 2.0], [2.0, 2.0])
    assert r == {"ratio": 1.0, "low": 1.0, "high": 1.0, "significant": False}


def test_band_open_when_baseline_spread_reaches_zero():
    r = ratio_with_band(
        [1.0, 1.0, 1.0], [0.1, 1.0, 2.0]
    )  # base median 1.0, mad 0.9 -> 0.1 > 0 still
    assert math.isfinite(r["high"])
    r = ratio_with_band([1.0, 1.0, 1.0], [0.0, 1.0, 3.0])  # mad 1.0 == median -> no upper bound
    assert r["high"] == math.inf and r["significant"] is False


def test_band_from_spread_matches_samples_version():
    spec, base = [4.1, 4.2, 4.15, 4.12, 4.18], [5.2, 5.3, 5.25, 5.22, 5.28]
    assert band_from_spread(median(spec), mad(spec), median(base), mad(base)) == ratio_with_band(
        spec, base
    )


def test_band_from_spread_measured_h200_slower_case():
    # H200, c=1: k=3 L=2.5 TPOT 6.86 ms (spread 0.2) against baseline 5.24 ms (spread 0.0)
    r = band_from_spread(6.86, 0.2, 5.24, 0.0)
    assert r["ratio"] == pytest.approx(6.86 / 5.24)
    assert r["low"] == pytest.approx(6.66 / 5.24) and r["significant"] is True
    with pytest.raises(ValueError):
        band_from_spread(1.0, -0.1, 1.0, 0.0)
