"""The rate-change floor (matrix/build_bisect/bound_rate.py): the exact minimum over the alternatives'
rates against brute force, the evidence floor against a brute-force search of loads, a probe's
information against the clean regression's closed form, and no virtual run below the floor."""

from __future__ import annotations

import numpy as np
import pytest

from soakmatrix.matrix.bisect.bound import binary_divergence
from soakmatrix.matrix.build_bisect import BuildSettings, VirtualBuildOracle, bisect_builds
from soakmatrix.matrix.build_bisect.bound import probe_bits
from soakmatrix.matrix.build_bisect.bound_rate import (
    divergence,
    evidence_floor,
    least_divergence,
    probe_information,
    rate_change_bound,
)


@pytest.mark.parametrize("k", [4.0, 8.0, 16.0, 50.0])
def test_the_least_divergence_is_the_brute_force_minimum_over_the_allowed_rates(k):
    rng = np.random.default_rng(1)
    rates = np.concatenate([np.geomspace(1e-4, 0.25, 4000), np.geomspace(4.0 / k, 50.0, 4000)])
    for v, x in rng.uniform(0.1, 30.0, size=(25, 2)):
        brute = float(np.min(v * divergence(1.0, rates) + x * divergence(1.0 / k, rates)))
        exact = float(least_divergence(v, x, k))
        assert exact <= brute + 1e-9 and exact == pytest.approx(brute, rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("k,sigma", [(4.0, 1 / 3), (16.0, 1 / 3), (16.0, 1.0)])
def test_no_load_that_meets_the_evidence_costs_less_than_the_floor(k, sigma):
    floor, v, x = evidence_floor(k, sigma, 0.99)
    need = binary_divergence(0.99, 0.01)
    grid = np.linspace(0.0, 60.0, 1201)
    vv, xx = np.meshgrid(grid, grid, indexing="ij")
    ok = least_divergence(vv, xx, k) >= need
    cost = vv + xx + sigma * (vv + xx / k)
    brute = float(cost[ok].min())
    assert floor <= brute and floor == pytest.approx(brute, rel=0.03)
    assert least_divergence(v * 1.02, x * 1.02, k) >= need * 0.98     # the optimum reported meets it


def test_with_no_old_rate_a_probe_tells_what_the_clean_regression_s_does():
    for p, length in ((0.5, 1.0), (0.3, 2.5), (0.8, 0.4)):
        assert probe_information(p, length, 1e7) == pytest.approx(float(probe_bits(p, length)), abs=2e-3)
    # an old rate makes a probe tell less
    assert probe_information(0.5, 1.0, 4.0) < probe_information(0.5, 1.0, 16.0) < float(probe_bits(0.5, 1.0))


def test_no_virtual_run_beats_the_rate_change_floor_on_average():
    n, mttf = 16, 1800.0
    bound = rate_change_bound(n, mttf, 16.0, 600.0, 0.99)
    hours = []
    for seed in range(4):
        o = VirtualBuildOracle(n, 9, mttf, seed=seed, old_mttf_s=16 * mttf)
        hours.append(bisect_builds([f"b{i}" for i in range(n)], o,
                                   BuildSettings(signature="shm_broadcast_timeout")).gpu_hours)
    assert np.mean(hours) >= bound.gpu_hours
    assert bound.gpu_hours == max(bound.evidence_gpu_hours, bound.search_gpu_hours)
    with pytest.raises(ValueError, match="below the model"):
        rate_change_bound(n, mttf, 2.0, 600.0, 0.99)


def test_the_spread_floor_shares_the_error_budget_over_the_change_points_below():
    from soakmatrix.matrix.build_bisect.bound import search_bits
    from soakmatrix.matrix.build_bisect.bound_rate_spread import rate_spread_floor

    sigma, c = 600.0 / 1800.0, 0.99
    small, _ = rate_spread_floor(4, 16.0, sigma, c, search_bits(4, c))
    large, rho = rate_spread_floor(128, 16.0, sigma, c, search_bits(128, c))
    assert 0 < small < large                   # more change points below, each with a smaller share
    assert 16.0 ** -1 * 4 <= rho               # the refuting worlds are rate changes of x4 or more
    bound = rate_change_bound(128, 1800.0, 16.0, 600.0, c)
    assert bound.spread_gpu_hours == pytest.approx(large * 0.5)
    assert bound.evidence_gpu_hours >= bound.spread_gpu_hours > 0
