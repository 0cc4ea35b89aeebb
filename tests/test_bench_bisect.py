"""The bisection benchmark's diagnostic `--told-modifier`: the modifier verdicts' search is told
which flag is the planted modifier, the answers stay right, and nothing is left patched after."""

from __future__ import annotations

from benchmarks.bench_bisect import Case, _run_bisect
from soakmatrix.matrix.bisect import modifiers


def _run(case: Case, told: bool) -> list[tuple]:
    return _run_bisect((case, list(range(12)), False, 1, told, None))


def test_told_modifier_goes_straight_to_the_planted_flag_and_is_undone_after():
    own = modifiers._likeliest
    case = Case(6, 1, 600.0, modifier=True)
    told = _run(case, True)
    assert modifiers._likeliest is own
    # the planted set found, and the x8 modifier called one, in (nearly) every run either way
    assert sum(r[1] for r in told) >= 11
    assert sum(r[4] for r in told) >= 10
    # told where the modifier is, the modifier verdicts never soak a group that holds it once the
    # group has not cleared: fewer GPU-hours over the same seeds
    plain = _run(case, False)
    assert sum(r[0] for r in told) < sum(r[0] for r in plain)


def test_told_modifier_changes_nothing_in_a_row_without_a_modifier():
    case = Case(6, 1, 600.0)
    assert [r[0] for r in _run(case, True)] == [r[0] for r in _run(case, False)]
