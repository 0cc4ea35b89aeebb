"""The lower bound on bisection's GPU-hours: its constraint, its shape, and that no run beats it."""

from __future__ import annotations

import math

import pytest

from soakmatrix.matrix.bisect import Element, Settings, bisect
from soakmatrix.matrix.bisect.bound import binary_divergence, lower_bound, refute_load
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


@pytest.mark.parametrize("k", [1, 2])
def test_no_bisection_run_beats_the_bound_on_average(k):
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
    floor = lower_bound(n, k, mttf, 600.0, 0.99).gpu_hours
    assert sum(spent) / len(spent) > floor
    # and not absurdly above it. The floor is for the cap's question; the default question is harder
    # (no hang without a necessary flag up to 8x the failing cell's MTTF, and each other flag's
    # modifier verdict measured), and its own floor is not derived yet (issue 18 item 6)
    assert sum(spent) / len(spent) < 8 * floor
