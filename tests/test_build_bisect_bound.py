"""The floor under build bisection's GPU-hours: its constraint, a brute-force check of the
optimisation and of the worst neighbour's rate, the spread floor's dual against its primal solved
by brute force, Fano's bits, a probe's information by enumeration, the search floor, and that no
run beats it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from soakmatrix.matrix.bisect.bound import binary_divergence, refute_load
from soakmatrix.matrix.build_bisect import BuildSettings, VirtualBuildOracle, bisect_builds
from soakmatrix.matrix.build_bisect.bound import (lower_bound, probe_bits, probe_cost, search_bits, search_rate,
                                                   spread_floor, spread_value)

pytestmark = pytest.mark.slow   # the floors are checked against many seeded bisections and brute force


def test_the_evidence_is_against_the_neighbour_below():
    b = lower_bound(32, 2280.0, 600.0, 0.99)
    # within one world nothing spreads the error budget over other answers: q = 1 - c
    assert b.evidence == pytest.approx(binary_divergence(0.99, 0.01)) == pytest.approx(0.98 * math.log(99))
    assert b.hang_mttfs * math.log1p(b.refute_mttfs / b.hang_mttfs) == pytest.approx(b.evidence)
    assert b.refute_mttfs == pytest.approx(refute_load(b.hang_mttfs, b.evidence))


def test_the_worst_neighbour_rate_by_brute_force():
    # KL per unit load of W (rate 1 on bad builds, 0 on build J-1) to W'(lambda'): build J-1 gives
    # lambda', bad builds lambda' - 1 - ln lambda'; its minimum over lambda' is Y ln(1 + X / Y)
    for x, y in [(8.0, 4.0), (3.0, 10.0), (20.0, 1.0)]:
        grid = np.exp(np.linspace(-8, 2, 200001))
        kl = x * grid + y * (grid - 1.0 - np.log(grid))
        assert kl.min() == pytest.approx(y * math.log1p(x / y), rel=1e-6)
        assert grid[kl.argmin()] == pytest.approx(y / (x + y), rel=1e-3)


@pytest.mark.parametrize("n,mttf", [(2, 600.0), (8, 2280.0), (512, 7200.0)])
def test_the_optimum_by_brute_force(n, mttf):
    c, s = 0.99, 600.0
    b = lower_bound(n, mttf, s, c)
    d = binary_divergence(c, 1 - c)
    bits = search_bits(n, c)
    best = math.inf
    for y in np.linspace(2 * c - 1, 40.0, 40001):
        x = y * math.expm1(d / y)          # the least X that meets the evidence
        best = min(best, x + y + s / mttf * max(y + 2 * c - 1, bits))
    assert b.neighbour_gpu_hours == pytest.approx(best * mttf / 3600.0, rel=1e-5)
    assert b.evidence_gpu_hours >= b.neighbour_gpu_hours
    assert b.gpu_hours == pytest.approx(max(b.evidence_gpu_hours, b.search_gpu_hours))


def test_fanos_bits():
    assert search_bits(2, 0.99) == 0.0                       # one change point: nothing to search
    assert search_bits(9, 0.99) == pytest.approx(3 - (-(0.01 * math.log2(0.01) + 0.99 * math.log2(0.99)))
                                                 - 0.01 * math.log2(7))
    assert search_bits(513, 0.99) > 8.8


def test_the_bound_grows_with_what_is_asked():
    base = lower_bound(32, 2280.0, 600.0, 0.99).gpu_hours
    assert lower_bound(32, 2280.0, 600.0, 0.999).gpu_hours > base
    assert lower_bound(32, 7200.0, 600.0, 0.99).gpu_hours > base
    assert lower_bound(32, 2280.0, 1200.0, 0.99).gpu_hours > base
    assert lower_bound(512, 600.0, 600.0, 0.99).gpu_hours > lower_bound(8, 600.0, 600.0, 0.99).gpu_hours
    assert lower_bound(32, 2280.0, 600.0, 0.99, gpus=4).gpu_hours == pytest.approx(4 * base)
    with pytest.raises(ValueError):
        lower_bound(1, 600.0, 600.0, 0.99)


def test_a_probes_information_by_enumeration():
    # I(B; outcome) from the joint law of (bad?, hang?) summed term by term: a good build never hangs
    for p, length in [(0.5, 1.0), (0.2, 3.0), (0.9, 0.3)]:
        q = math.exp(-length)
        joint = {(1, "hang"): p * (1 - q), (1, "pass"): p * q, (0, "hang"): 0.0, (0, "pass"): 1 - p}
        pb = {1: p, 0: 1 - p}
        po = {"hang": p * (1 - q), "pass": p * q + 1 - p}
        mi = sum(v * math.log2(v / (pb[b] * po[o])) for (b, o), v in joint.items() if v > 0)
        assert float(probe_bits(p, length)) == pytest.approx(mi, rel=1e-9)
        assert float(probe_cost(p, length, 0.25)) == pytest.approx(0.25 + p * (1 - q) + (1 - p) * length)


@pytest.mark.parametrize("sigma", [0.0833, 0.263, 1.0])
def test_the_search_rate_by_brute_force(sigma):
    r, p, length = search_rate(sigma)
    ps = np.linspace(0.001, 0.999, 999)[:, None]
    ls = np.linspace(0.01, 12.0, 2400)[None, :]
    brute = (probe_bits(ps, ls) / probe_cost(ps, ls, sigma)).max()
    assert brute <= r * (1 + 1e-9)
    assert r == pytest.approx(brute, rel=1e-3)
    assert float(probe_bits(p, length) / probe_cost(p, length, sigma)) == pytest.approx(r, rel=1e-9)
    assert r < 1.0 / sigma                   # a bit costs at least a start-up


def test_the_spread_floor_grows_with_the_change_points_below():
    # the neighbour floor is flat in n; spread over the change points below, the budget left for
    # each falls like 1 / J, and the evidence against them grows like ln J
    for mttf in (600.0, 2280.0, 7200.0):
        one, few, many = (lower_bound(n, mttf, 600.0, 0.99) for n in (2, 8, 512))
        assert one.neighbour_gpu_hours == pytest.approx(few.neighbour_gpu_hours, rel=0.02)
        # one change point: its one neighbour holds the whole budget, the two floors agree
        assert one.evidence_gpu_hours == pytest.approx(one.neighbour_gpu_hours, rel=0.02)
        assert few.evidence_gpu_hours > 1.15 * few.neighbour_gpu_hours
        assert many.evidence_gpu_hours > 1.5 * many.neighbour_gpu_hours > many.neighbour_gpu_hours
        assert many.gpu_hours == many.evidence_gpu_hours > many.search_gpu_hours
        assert many.search_gpu_hours == pytest.approx(many.search_bits / many.bits_per_mttf * mttf / 3600.0)


def _spread_primal(n: int, sigma: float, c: float, rho: float, splits: int) -> float:
    """The spread floor's primal at one rho, solved by brute force: every split of the budget
    N (1 - c) over the change points on a grid, each change point's least cost by a bounded
    minimisation over Y (for n <= 4 the probes' Fano constraint never binds: see the test)."""
    rows, d_nb, fy = n - 1, binary_divergence(c, 1 - c), 2 * c - 1
    gap = rho - 1 - math.log(rho)

    def least(j: int, budget: float) -> float:
        share = min(budget / j, c)
        d = binary_divergence(c, share) if share < c else 0.0
        def cost(y):
            x = max(y * math.expm1(d_nb / y), (d - y * gap) / rho, 0.0)
            return x + y + sigma * (y + fy)
        found = minimize_scalar(cost, bounds=(fy, 100.0), method="bounded", options={"xatol": 1e-10})
        return min(float(found.fun), cost(fy))

    total, best = rows * (1 - c), math.inf
    shares = np.linspace(0.0, 1.0, splits + 1)[1:-1]
    for a in shares:
        for b in shares[shares < 1 - a]:
            parts = [a, b, 1 - a - b][:rows] if rows == 3 else [a, 1 - a]
            best = min(best, sum(least(j + 1, p * total) for j, p in enumerate(parts)) / rows)
    return best


@pytest.mark.parametrize("n,sigma,rho", [(3, 1.0, 0.3), (4, 0.263, 0.35), (4, 1.0, 0.6)])
def test_the_spread_dual_against_its_primal_by_brute_force(n, sigma, rho):
    # weak duality: the dual is a floor of the primal at every rho; its grids cost it under 3 %
    dual, _ = spread_value(n, sigma, 0.99, search_bits(n, 0.99), 0.0, rho, 0.0)
    primal = _spread_primal(n, sigma, 0.99, rho, 60)
    assert 0.97 * primal < dual <= primal
    # every change point's probes are at least Y + 2c - 1 >= 2 (2c - 1), above Fano's bits: the
    # primal may leave that constraint out
    assert search_bits(n, 0.99) < 2 * (2 * 0.99 - 1)


def test_the_spread_dual_is_a_floor_at_any_price():
    # any rho, nu and mu give a floor; the reported one is the best found, above a few others
    n, sigma, bits = 32, 0.263, search_bits(32, 0.99)
    best = spread_floor(n, sigma, 0.99, bits)
    for rho in (0.1, 0.3, 1.0):
        for nu in (0.0, sigma):
            assert spread_value(n, sigma, 0.99, bits, 0.0, rho, nu)[0] <= best.mttfs + 1e-9
    with pytest.raises(ValueError):
        spread_value(n, sigma, 0.99, bits, 0.0, 0.3, 2 * sigma)      # nu above sigma: no floor


@pytest.mark.parametrize("n", [8, 128])
def test_no_run_beats_the_bound_on_average(n):
    mttf = 600.0
    spent = []
    for seed in range(60):
        cp = int(np.random.default_rng(seed).integers(1, n))
        r = bisect_builds([f"b{i}" for i in range(n)], VirtualBuildOracle(n, cp, mttf, seed=seed + 500),
                          BuildSettings(signature="shm_broadcast_timeout"))
        spent.append(r.gpu_hours)
    floor = lower_bound(n, mttf, 600.0, 0.99).gpu_hours
    assert floor < np.mean(spent) < 3 * floor


def test_a_background_hang_ends_probes_the_evidence_floor_counts():
    # every build also hangs with another signature at MTTF 3 h: over the load the evidence needs,
    # those hangs end beta (X + Y) probes, each a start-up more; the evidence itself is unchanged
    plain = lower_bound(8, 7200.0, 600.0, 0.99)
    flaky = lower_bound(8, 7200.0, 600.0, 0.99, background_mttf_s=3 * 3600.0)
    beta = 7200.0 / (3 * 3600.0)
    assert flaky.probes == pytest.approx(flaky.hang_mttfs + beta * (flaky.refute_mttfs + flaky.hang_mttfs))
    assert flaky.evidence == plain.evidence and flaky.gpu_hours > plain.gpu_hours
    rarer = lower_bound(8, 7200.0, 600.0, 0.99, background_mttf_s=10 * 3600.0)
    assert plain.gpu_hours < rarer.gpu_hours < flaky.gpu_hours
    # a background hang far rarer than the target's leaves the floor about as it was (2c - 1 binds
    # or nearly: beta (X + Y) is about 1 hang over the spread floor's load)
    assert lower_bound(8, 600.0, 600.0, 0.99, background_mttf_s=3 * 3600.0).gpu_hours == pytest.approx(
        lower_bound(8, 600.0, 600.0, 0.99).gpu_hours, rel=1e-3)
    with pytest.raises(ValueError, match="background"):
        lower_bound(8, 600.0, 600.0, 0.99, background_mttf_s=0.0)
    spent = []
    for seed in range(60):
        cp = int(np.random.default_rng(seed).integers(1, 8))
        r = bisect_builds([f"b{i}" for i in range(8)],
                          VirtualBuildOracle(8, cp, 7200.0, seed=seed + 500, background_mttf_s=3 * 3600.0),
                          BuildSettings(signature="shm_broadcast_timeout"))
        spent.append(r.gpu_hours)
    assert flaky.gpu_hours < np.mean(spent)
