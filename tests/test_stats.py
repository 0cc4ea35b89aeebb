"""Statistics of intermittent hangs: the bounds REFERENCE.md states, and the interval's coverage."""

import math

import numpy as np
import pytest

from soakmatrix.matrix.contracts import stats


def test_rule_of_three_at_95_percent():
    # zero hangs in 3 h: MTTF >= 1 h at 95% (T / ln 20 = T / 2.996)
    assert stats.mttf_lower_bound(3 * 3600, 0.95) == pytest.approx(3600, rel=0.002)
    assert stats.rate_upper_bound(100.0, 0.95) == pytest.approx(0.02996, rel=1e-3)
    assert stats.mttf_lower_bound(0.0) == 0.0


def test_soak_for_detection_matches_reference():
    assert stats.soak_for_detection(60.0, 0.95) == pytest.approx(3.0 * 60, rel=0.002)
    assert stats.soak_for_detection(60.0, 0.99) == pytest.approx(4.6 * 60, rel=0.002)
    assert stats.detection_probability(60.0, stats.soak_for_detection(60.0, 0.9)) == pytest.approx(0.9)


def test_soak_for_probes_is_bonferroni():
    assert stats.soak_for_probes(10.0, 0.95, 5) == pytest.approx(stats.soak_for_detection(10.0, 0.99))


def test_mttf_estimate_and_interval():
    est = stats.mttf_estimate(4, 8000.0, 0.95)
    assert est.point_s == 2000.0
    assert est.low_s < 2000.0 < est.high_s
    none = stats.mttf_estimate(0, 3000.0, 0.95)
    assert math.isinf(none.point_s) and none.low_s == pytest.approx(1001, rel=0.01)
    assert none.describe().startswith("> ")


def test_interval_covers_the_true_mttf_at_its_confidence():
    rng = np.random.default_rng(3)
    mttf, covered, trials = 1000.0, 0, 2000
    for _ in range(trials):
        r = 3
        exposure = rng.exponential(mttf, size=r).sum()
        est = stats.mttf_estimate(r, exposure, 0.90)
        covered += est.low_s <= mttf <= est.high_s
    assert covered / trials >= 0.88   # the swapped degrees of freedom give about 0.79


def test_compare_rates_finds_an_eightfold_modifier_and_not_noise():
    strong = stats.compare_rates(16, 16 * 2280.0, 2, 2 * 8 * 2280.0 * 4)
    assert strong.ratio > 4 and strong.p_value < 0.01
    same = stats.compare_rates(5, 5000.0, 5, 5200.0)
    assert same.p_value > 0.5
    assert stats.compare_rates(0, 10.0, 0, 10.0).p_value == 1.0


def test_bad_confidence_is_refused():
    with pytest.raises(ValueError):
        stats.mttf_lower_bound(10.0, 1.0)
