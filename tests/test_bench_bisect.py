"""The bisection benchmark's diagnostics: `--told-modifier` (the modifier verdicts' search is told
which flag is the planted modifier) and `--holm-least` (the necessity rule-outs step down); the
answers stay right. Both reach the bisection through its policy (`Policy.told_modifier`,
`Policy.holm_least`)."""

from __future__ import annotations

import pytest

from benchmarks.bench_bisect import Case, _run_bisect

pytestmark = pytest.mark.slow   # the benchmark's own bisections over twelve seeds each


def _run(case: Case, told: bool, holm_least: int | None = None) -> list[tuple]:
    return _run_bisect((case, list(range(12)), False, 1, told, holm_least))


def test_told_modifier_goes_straight_to_the_planted_flag():
    case = Case(6, 1, 600.0, modifier=True)
    told = _run(case, True)
    # the planted set found, and the x8 modifier called one, in (nearly) every run either way
    assert sum(r[1] for r in told) >= 11
    assert sum(r[4] for r in told) >= 10
    # told where the modifier is, the search for it is skipped: fewer GPU-hours over the same seeds
    plain = _run(case, False)
    assert sum(r[0] for r in told) < sum(r[0] for r in plain)


def test_told_modifier_changes_nothing_in_a_row_without_a_modifier():
    case = Case(6, 1, 600.0)
    assert [r[0] for r in _run(case, True)] == [r[0] for r in _run(case, False)]


def test_holm_least_loosens_the_rule_outs_of_several_kept_flags():
    case = Case(6, 3, 600.0)
    stepped = _run(case, False, holm_least=1)
    assert sum(r[1] for r in stepped) >= 11
    # three necessary flags: the second and third rule-outs at alpha / 2 and alpha, not alpha / 3
    assert sum(r[0] for r in stepped) < sum(r[0] for r in _run(case, False))
