"""The floor under build bisection's GPU-hours: its constraint, a brute-force check of the
optimisation and of the worst neighbour's rate, Fano's bits, a probe's information by enumeration,
the search floor, and that no run beats it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from soakmatrix.matrix.bisect.bound import binary_divergence, refute_load
from soakmatrix.matrix.build_bisect import BuildSettings, VirtualBuildOracle, bisect_builds
from soakmatrix.matrix.build_bisect.bound import lower_bound, probe_bits, probe_cost, search_bits, search_rate


def test_the_evidence_is_against_the_neighbour_below():
    b = lower_bound(32, 2280.0, 600.0, 0.99)
    # the builds are ordered: no symmetry spreads the error budget, q = 1 - c
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
    assert b.evidence_gpu_hours == pytest.approx(best * mttf / 3600.0, rel=1e-5)
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


def test_the_search_floor_binds_with_many_builds():
    # the evidence floor is flat in n (its search costs start-ups only); the search floor grows
    # with log2(n - 1) bits, each costing load too
    for mttf in (600.0, 2280.0, 7200.0):
        few, many = lower_bound(8, mttf, 600.0, 0.99), lower_bound(512, mttf, 600.0, 0.99)
        assert few.gpu_hours == few.evidence_gpu_hours > few.search_gpu_hours
        assert many.gpu_hours == many.search_gpu_hours > many.evidence_gpu_hours
        assert many.search_gpu_hours == pytest.approx(many.search_bits / many.bits_per_mttf * mttf / 3600.0)


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
    # a background hang far rarer than the target's leaves the floor as it was (2c - 1 binds)
    assert lower_bound(8, 600.0, 600.0, 0.99, background_mttf_s=3 * 3600.0).gpu_hours == pytest.approx(
        lower_bound(8, 600.0, 600.0, 0.99).gpu_hours)
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
