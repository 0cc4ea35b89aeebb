"""The lower bound on bisection's GPU-hours: its constraint, its shape, and that no run beats it."""

from __future__ import annotations

import math

import pytest

from soakmatrix.matrix.bisect import Element, Settings, bisect
from soakmatrix.matrix.bisect.bound import binary_divergence, lower_bound, refute_load
from benchmarks.bound_default import (
    default_floor,
    detect_information,
    other_flags_split,
    plain_modifier_load,
    rule_out_load,
    second_modifier_information,
    split_information,
)
from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel


def test_binary_divergence():
    assert binary_divergence(0.5, 0.5) == 0.0
    assert binary_divergence(0.99, 0.001) == pytest.approx(0.99 * math.log(990) + 0.01 * math.log(0.01 / 0.999))
    # the evidence a stated 0.99 needs against one of n - k + 1 equally likely wrong supersets
    assert lower_bound(10, 2, 2280.0, 600.0, 0.99).evidence == pytest.approx(binary_divergence(0.99, 0.01 / 9))


def test_the_optimum_spends_exactly_the_evidence_each_flag_needs():
    b = lower_bound(10, 2, 2280.0, 600.0, 0.99)
    # Y ln(1 + X / Y) = d(c, q): the likelihood ratio against "one flag fewer is enough", at the
    # rate that makes that world hardest to tell apart
    assert b.hang_mttfs * math.log1p(b.refute_mttfs / b.hang_mttfs) == pytest.approx(b.evidence)
    assert refute_load(b.hang_mttfs, b.evidence) == pytest.approx(b.refute_mttfs)
    # with the rate unknown, refuting takes longer than the known-rate ln(1/q) MTTFs
    assert b.refute_mttfs > b.evidence
    # the cost in GPU-hours is k X + Y (1 + s/M) + start-ups of the k refutations, in MTTFs
    sigma = 600.0 / 2280.0
    q = 0.01 / 9
    mttfs = 2 * b.refute_mttfs + b.hang_mttfs * (1 + sigma) + 2 * (0.99 - q) * sigma
    assert b.gpu_hours == pytest.approx(mttfs * 2280.0 / 3600.0, rel=1e-6)


def test_the_bound_grows_with_what_is_asked():
    base = lower_bound(10, 2, 2280.0, 600.0, 0.99).gpu_hours
    assert lower_bound(10, 2, 2280.0, 600.0, 0.999).gpu_hours > base      # more confidence
    assert lower_bound(10, 3, 2280.0, 600.0, 0.99).gpu_hours > base       # more culprits
    assert lower_bound(12, 2, 2280.0, 600.0, 0.99).gpu_hours > base       # more flags to tell apart
    assert lower_bound(10, 2, 7200.0, 600.0, 0.99).gpu_hours > base       # a rarer hang
    assert lower_bound(10, 2, 2280.0, 1200.0, 0.99).gpu_hours > base      # slower start-ups
    assert lower_bound(10, 2, 2280.0, 600.0, 0.99, gpus=8).gpu_hours == pytest.approx(8 * base)
    with pytest.raises(ValueError):
        lower_bound(3, 4, 2280.0, 600.0, 0.99)


def test_the_issues_cost_target_is_below_the_bound():
    # issue 6 asks n = 10, k = 2, MTTF 38 min at 0.99 for at most 14 GPU-hours, and at most 1.3 x
    # the information bound (6 probes x (10 min + 38 min x (1 + ln 100) / 2) = 11.6 GPU-hours)
    b = lower_bound(10, 2, 2280.0, 600.0, 0.99)
    assert 19.5 < b.gpu_hours < 20.5
    info = 6 * (600.0 + 2280.0 * (1 + math.log(100)) / 2) / 3600.0
    assert b.gpu_hours > 1.3 * info > 14.0


def _poisson_kl(rate: float, other: float) -> float:
    """KL(Poisson(rate) || Poisson(other)) per unit of load, computed plainly."""
    if rate == 0:
        return other
    return rate * math.log(rate / other) - rate + other


def test_the_default_questions_closed_forms_match_a_brute_force_minimum():
    grid = [math.exp(x / 400.0) for x in range(-4000, 4000)]
    y, x, f = 12.0, 40.0, 8.0
    # necessity against an x F modifier: load y on configs holding T (rate 1 -> beta), load x on
    # configs without t (rate 0 -> beta / F); the worst beta
    brute = min(y * _poisson_kl(1.0, b) + x * _poisson_kl(0.0, b / f) for b in grid)
    assert brute == pytest.approx(y * math.log1p(x / (f * y)), rel=1e-4)
    assert rule_out_load(y, f, y * math.log1p(x / (f * y))) == pytest.approx(x)
    # plain world against "u is an x F modifier" (with u at a, without at a / F)
    a_, b_ = 7.0, 5.0
    brute = min(a_ * _poisson_kl(1.0, a) + b_ * _poisson_kl(1.0, a / f) for a in grid)
    assert split_information(a_, b_, f) == pytest.approx(brute, rel=1e-4)
    # modifier world (with u at 1, without at 1 / F) against "u irrelevant" (one rate mu)
    brute = min(a_ * _poisson_kl(1.0, m) + b_ * _poisson_kl(1.0 / f, m) for m in grid)
    assert detect_information(a_, b_, f) == pytest.approx(brute, rel=1e-4)


def test_the_default_floor_is_the_minimum_of_its_cost_over_a_grid():
    n, k, mttf, s, c, f = 10, 2, 2280.0, 600.0, 0.99, 8.0
    b = default_floor(n, k, mttf, s, c, f)
    d_rule = binary_divergence(c, 1 - c)
    d_same = binary_divergence(c, (1 - c) / (n - k + 1))
    y_m = plain_modifier_load(f, binary_divergence(1 - c, c))
    sigma = s / mttf

    def mttfs(y: float) -> float:
        x = max(refute_load(y, d_same), rule_out_load(y, f, d_rule))
        return k * x + y * (1 + sigma) + k * (2 * c - 1) * sigma

    grid = [y_m + i * 0.01 for i in range(20000)]
    best = min(mttfs(y) for y in grid)
    assert b.gpu_hours == pytest.approx(best * mttf / 3600.0, rel=1e-4)
    assert b.gpu_hours <= best * mttf / 3600.0 + 1e-9
    assert b.hang_mttfs >= b.modifier_hang_mttfs == pytest.approx(y_m)
    # at the optimum the rule-out binds: Y ln(1 + X / (F Y)) = d(c, 1 - c)
    assert b.hang_mttfs * math.log1p(b.refute_mttfs / (f * b.hang_mttfs)) == pytest.approx(d_rule, rel=1e-6)
    # the best split of Y_m carries exactly the evidence the modifier verdicts need
    best_split = max(split_information(y_m - z, z, f) for z in [y_m * i / 4000 for i in range(4001)])
    assert best_split == pytest.approx(binary_divergence(1 - c, c), rel=1e-4)


def test_the_modifier_worlds_floor_beats_every_point_of_a_grid_that_meets_its_constraint():
    n, k, mttf, s, c, f = 10, 2, 2280.0, 600.0, 0.99, 8.0
    b = default_floor(n, k, mttf, s, c, f, modifier=True)
    assert detect_information(b.hang_mttfs, b.slow_mttfs, f) >= b.modifier_evidence * (1 - 1e-6)
    d_rule = binary_divergence(c, 1 - c)
    d_same = binary_divergence(c, (1 - c) / (n - k))
    sigma = s / mttf
    cheapest = math.inf
    for i in range(1, 120):
        for j in range(1, 120):
            y1, z = i * 0.25, j * 0.25
            if detect_information(y1, z, f) < b.modifier_evidence:
                continue
            y_eff = y1 + z / f
            x = max(refute_load(y_eff, d_same), rule_out_load(y_eff, f, d_rule))
            cheapest = min(cheapest, k * x + y1 + z + sigma * y_eff + k * (2 * c - 1) * sigma)
    assert b.gpu_hours <= cheapest * mttf / 3600.0 + 1e-9
    assert b.gpu_hours == pytest.approx(cheapest * mttf / 3600.0, rel=0.02)


@pytest.mark.parametrize("n,k,mttf", [(n, k, m) for n in (6, 10, 12) for k in (1, 2, 3) for m in (600.0, 2280.0, 7200.0)])
def test_the_modifier_floor_already_pays_for_the_other_flags_verdicts_and_the_set_alone(n, k, mttf):
    """In every `+x8 mod` row of the benchmark, the modifier world's optimum loads, split over four
    configs, also carry the evidence against "another flag is a modifier too" and "another flag,
    not u, is the modifier", and the set alone's hang: the floor needs no more load for them.
    Checked here against a plain grid over the alternative's free rate, not the module's own
    minimiser."""
    c, f = 0.99, 8.0
    b = default_floor(n, k, mttf, 600.0, c, f, modifier=True)
    split = other_flags_split(b, n, k, c, f)
    assert split is not None
    both, only_u, only_v, neither = split
    assert min(split) >= 0
    assert both + only_u == pytest.approx(b.hang_mttfs) and only_v + neither == pytest.approx(b.slow_mttfs)

    def kl(r, s):
        return r * math.log(r / s) - r + s

    rates = [math.exp(i / 500.0) for i in range(-6000, 3001)]
    second = min(both * kl(1, x) + only_u * kl(1, x / f) + only_v * kl(1 / f, x / f) + neither * kl(1 / f, x / f ** 2)
                 for x in rates)
    swapped = min(both * kl(1, x) + only_u * kl(1, x / f) + only_v * kl(1 / f, x) + neither * kl(1 / f, x / f)
                  for x in rates)
    q = 1 - c       # family-wise control bounds one flag's false call by 1 - c, no tighter
    assert second >= binary_divergence(q, c) * (1 - 1e-6)
    assert swapped >= binary_divergence(c, q) * (1 - 1e-6)
    assert neither / f >= 2 * c - 1 and only_u >= 2 * c - 1        # expected hangs of the set alone, set + u
    # a split that puts no load on the set plus u cannot carry the first (u's load must leave v out)
    assert second_modifier_information(b.hang_mttfs, 0.0, only_v, neither, f) < binary_divergence(q, c)


def test_the_default_floor_grows_with_what_is_asked():
    base = default_floor(10, 2, 2280.0, 600.0, 0.99)
    assert base.gpu_hours > lower_bound(10, 2, 2280.0, 600.0, 0.99).gpu_hours      # a harder question
    assert default_floor(10, 2, 2280.0, 600.0, 0.99, modifier=True).gpu_hours > base.gpu_hours
    for factor in (4.0, 8.0, 16.0):          # ruling out a larger slowdown
        assert default_floor(10, 2, 2280.0, 600.0, 0.99, factor=factor).gpu_hours < \
            default_floor(10, 2, 2280.0, 600.0, 0.99, factor=2 * factor).gpu_hours
    # but not below x4: the same factor is the modifier the verdicts must be able to call, and an
    # x2 one takes more hangs to tell from "irrelevant" than the x2 rule-out saves
    x2 = default_floor(10, 2, 2280.0, 600.0, 0.99, factor=2.0)
    x4 = default_floor(10, 2, 2280.0, 600.0, 0.99, factor=4.0)
    assert x2.modifier_hang_mttfs > x4.modifier_hang_mttfs and x2.gpu_hours > x4.gpu_hours
    assert default_floor(10, 2, 2280.0, 600.0, 0.995).gpu_hours > base.gpu_hours
    assert default_floor(10, 3, 2280.0, 600.0, 0.99).gpu_hours > base.gpu_hours
    assert default_floor(10, 2, 7200.0, 600.0, 0.99).gpu_hours > base.gpu_hours
    assert default_floor(10, 2, 2280.0, 600.0, 0.99, gpus=4).gpu_hours == pytest.approx(4 * base.gpu_hours)
    # with the rate known (every hang free) the rule-out tends to F d(c, 1 - c) MTTFs per flag
    assert rule_out_load(1e6, 8.0, base.rule_out_evidence) == pytest.approx(8.0 * base.rule_out_evidence, rel=1e-5)
    assert 8.0 * binary_divergence(0.95, 0.05) < 8.0 * math.log(20)     # 21 MTTFs < 24 at 0.95: the floor of a necessary flag
    for bad in [dict(k=11), dict(confidence=0.4), dict(factor=1.0)]:
        args = dict(n=10, k=2, mttf_s=2280.0, startup_s=600.0, confidence=0.99) | bad
        with pytest.raises(ValueError):
            default_floor(**args)


@pytest.mark.parametrize("k", [1, 2])
def test_no_bisection_run_beats_the_floors_on_average(k):
    n, mttf = 6, 600.0
    names = [f"f{i}" for i in range(n)]
    registry = {f: flagmod.raw_flag(f, "bool", ["--f{value}"], default=False) for f in names}
    trigger = names[:k]
    model = HangModel(seed=1, hangs=(Hang("planted", "shm_broadcast", {f: (True,) for f in trigger}, mttf),))
    spent, right = [], 0
    for seed in range(40):
        oracle = VirtualOracle(model, seed=seed, startup_s=600.0, registry=registry, gpu_count=lambda f: 1)
        result = bisect({f: True for f in names}, [Element(f, True, False) for f in names], oracle,
                        Settings(confidence=0.99, startup_s=600.0), gpu_count=lambda f: 1)
        right += set(result.minimal) == set(trigger)
        spent.append(result.gpu_hours)
    assert right >= 38      # stated 0.99: a wrong set now and then is within it
    mean = sum(spent) / len(spent)
    # bisect answers the default question (no hang without a necessary flag up to x8, modifier
    # verdicts on the others): it can beat neither that question's floor nor the old one's
    floor = default_floor(n, k, mttf, 600.0, 0.99, Settings().rule_out_factor).gpu_hours
    assert mean > floor > lower_bound(n, k, mttf, 600.0, 0.99).gpu_hours
    # and stays near it. These 40 seeds measure 1.8 x (k = 1) and 1.4 x (k = 2); 1.9 x and 1.6 x before
    # the necessity soaks read the modifier soaks' hangs. 2.2 x fails if a change gives that back and
    # more. The 8 x here before was against the old question's floor, a third of this one: a bound
    # that loose said only that the default question costs more, not how much more.
    assert mean < 2.2 * floor
