"""A cell's state across nights and each signature's reach, over synthetic histories."""

from __future__ import annotations

import pytest

from soakmatrix.reports.history import RecordedResult
from soakmatrix.reports.state import (
    CellStatus,
    at_risk_s,
    cell_states,
    classify,
    mttf_estimate,
    new_failures,
    signature_summaries,
)

RUNS = [f"night{i}" for i in range(1, 7)]
CODE = {"P": "passed", "H": "hang", "C": "crash", "X": "config_error", "I": "infra_error", ".": None}


def history(cell: str, pattern: str, signature: str = "silent_stall", exposure: float = 3600.0) -> list[RecordedResult]:
    """`PPHPH.`: one letter per night (P passed, H hang, C crash, X config error, I infra error, . not run)."""
    out = []
    for run, letter in zip(RUNS, pattern):
        outcome = CODE[letter]
        if outcome is None:
            continue
        hung = outcome == "hang"
        out.append(RecordedResult(run, cell, outcome, signature if outcome in ("hang", "crash") else None,
                               exposure if outcome != "infra_error" else 0.0, 1800.0 if hung else None))
    return out


@pytest.mark.parametrize("pattern, status, first_failing", [
    ("PPPPPP", CellStatus.PASSING, None),
    ("PPPPPH", CellStatus.FAILING, "night6"),          # new tonight
    ("PPPHHH", CellStatus.FAILING, "night4"),          # regressed on night 4, failing since
    ("HHHHHH", CellStatus.CONSISTENTLY_FAILING, "night1"),
    ("XXXXXX", CellStatus.CONSISTENTLY_FAILING, "night1"),   # the engine refuses the flags every night
    ("PHPPHP", CellStatus.FLAKY, "night2"),            # hangs in some nights only
    ("HPPPPP", CellStatus.FLAKY, "night1"),            # a pass never proves a hang gone
    ("PHIIHI", CellStatus.FAILING, "night2"),          # infra errors are not verdicts
    ("IIIIII", CellStatus.NO_VERDICT, None),
    ("....H.", CellStatus.FAILING, "night5"),          # one verdict, a hang
    ("H.I.H.", CellStatus.CONSISTENTLY_FAILING, "night1"),
    ("PCPPPP", CellStatus.FLAKY, "night2"),
])
def test_state_of_a_cell(pattern, status, first_failing):
    state = cell_states(RUNS, history("c1", pattern))["c1"]
    assert state.status is status
    assert state.first_failing_run == first_failing
    assert [o.value if o else "." for _, o in state.history] == [CODE[ch] or "." for ch in pattern]


def test_counts_exposure_and_mttf_of_a_flaky_cell():
    state = cell_states(RUNS, history("c1", "PHPPHP"))["c1"]
    assert (state.hangs, state.failing_runs, state.verdict_runs) == (2, 2, 6)
    # a hang's exposure counts until it began (1800 s), not until the verdict
    assert state.exposure_s == 4 * 3600.0 + 2 * 1800.0 and state.last_failing_run == "night5"
    assert state.estimate.mttf_s == pytest.approx(9000.0)
    assert state.signatures == ["silent_stall"] and state.latest.value == "passed"


def test_run_order_comes_from_the_run_list_not_the_observation_order():
    obs = list(reversed(history("c1", "PPPHHH")))
    assert cell_states(RUNS, obs)["c1"].status is CellStatus.FAILING
    assert cell_states(list(reversed(RUNS)), obs)["c1"].status is CellStatus.FLAKY   # H H H P P P


def test_classify_edges():
    assert classify([]) is CellStatus.NO_VERDICT
    assert classify([True]) is CellStatus.FAILING
    assert classify([True, True]) is CellStatus.CONSISTENTLY_FAILING
    assert classify([False, True, False, True]) is CellStatus.FLAKY


def test_signature_summary_pools_mttf_over_all_exposure_of_the_cells_it_hit():
    obs = (history("a", "PPHPPH", "shm_broadcast_timeout")       # 2 hangs, 6 h
           + history("b", "..PHPP", "shm_broadcast_timeout")     # 1 hang, 4 h
           + history("c", "HHHHHH", "silent_stall", exposure=600.0)
           + history("d", "PPPPPP")                              # never hit: not pooled
           + history("e", "PPPPPC", "cuda_illegal_address"))
    sigs = {s.signature: s for s in signature_summaries(RUNS, obs)}
    shm = sigs["shm_broadcast_timeout"]
    assert shm.cells == ["a", "b"] and shm.first_seen_run == "night3" and shm.last_seen_run == "night6"
    assert shm.hits == 3 and shm.exposure_s == 7 * 3600.0 + 3 * 1800.0
    assert shm.estimate.mttf_s == pytest.approx((7 * 3600.0 + 3 * 1800.0) / 3)
    assert shm.estimate.low_s < shm.estimate.mttf_s < shm.estimate.high_s
    assert sigs["silent_stall"].estimate.mttf_s == pytest.approx(600.0) and sigs["silent_stall"].hits == 6
    assert sigs["cuda_illegal_address"].outcome.value == "crash"
    assert sigs["cuda_illegal_address"].first_seen_run == "night6"
    assert [s.signature for s in signature_summaries(RUNS, obs)][0] == "silent_stall"   # most hits first


def test_time_after_a_hang_began_is_not_exposure():
    hung = RecordedResult("night1", "c", "hang", "silent_stall", exposure_s=3700.0, time_to_hang_s=2200.0)
    passed = RecordedResult("night2", "c", "passed", None, exposure_s=3600.0, time_to_hang_s=None)
    assert at_risk_s(hung) == 2200.0 and at_risk_s(passed) == 3600.0
    assert cell_states(RUNS, [hung, passed])["c"].estimate.mttf_s == pytest.approx(5800.0)


def test_mttf_estimate_is_the_shared_statistics_module_s():
    # 3 hangs in 10 h: E/r = 3.33 h inside its interval; the interval itself is matrix.stats' to define
    from soakmatrix.matrix.contracts import stats
    est = mttf_estimate(3, 36_000.0)
    ref = stats.mttf_estimate(3, 36_000.0)
    assert est.mttf_s == pytest.approx(12_000.0)
    assert (est.low_s, est.high_s) == pytest.approx((ref.low_s, ref.high_s))
    assert 3_000.0 < est.low_s < 12_000.0 < est.high_s < 100_000.0
    none = mttf_estimate(0, 9_000.0)
    assert none.mttf_s is None and none.high_s is None and none.low_s == pytest.approx(3_000.0, rel=0.01)


def test_new_failures_of_a_run():
    obs = history("a", "PPPPPH") + history("b", "PPHHHH") + history("c", "PPPPPP")
    states = cell_states(RUNS, obs)
    assert new_failures("night6", states) == ["a"]
    assert new_failures("night3", states) == ["b"]
