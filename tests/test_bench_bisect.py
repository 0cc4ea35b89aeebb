"""The bisection benchmark's diagnostics: `--told-modifier` (the modifier verdicts' search is told
which flag is the planted modifier) and `--holm-least` (the necessity rule-outs step down); the
answers stay right. Both swap one of the bisection's functions for a run
(`benchmarks.bench_bisect.diagnostics`)."""

from __future__ import annotations

import pytest

from benchmarks.bench_bisect import Case, _run_bisect, diagnostics
from soakmatrix.matrix.bisect import Settings, ablation
from tests.test_bisect import MTTF, _search_with


def _run(case: Case, told: bool, holm_least: int | None = None) -> list[tuple]:
    return _run_bisect((case, list(range(12)), False, 1, told, holm_least))


@pytest.mark.slow   # the benchmark's own bisections over twelve seeds each
def test_told_modifier_goes_straight_to_the_planted_flag():
    case = Case(6, 1, 600.0, modifier=True)
    told = _run(case, True)
    # the planted set found, and the x8 modifier called one, in (nearly) every run either way
    assert sum(r[1] for r in told) >= 11
    assert sum(r[4] for r in told) >= 10
    # told where the modifier is, the search for it is skipped: fewer GPU-hours over the same seeds
    plain = _run(case, False)
    assert sum(r[0] for r in told) < sum(r[0] for r in plain)


@pytest.mark.slow   # the benchmark's own bisections over twelve seeds each
def test_told_modifier_changes_nothing_in_a_row_without_a_modifier():
    case = Case(6, 1, 600.0)
    assert [r[0] for r in _run(case, True)] == [r[0] for r in _run(case, False)]


@pytest.mark.slow   # the benchmark's own bisections over twelve seeds each
def test_holm_least_loosens_the_rule_outs_of_several_kept_flags():
    case = Case(6, 3, 600.0)
    stepped = _run(case, False, holm_least=1)
    assert sum(r[1] for r in stepped) >= 11
    # three necessary flags: the second and third rule-outs at alpha / 2 and alpha, not alpha / 3
    assert sum(r[0] for r in stepped) < sum(r[0] for r in _run(case, False))


def test_the_step_down_loosens_the_rule_out_of_the_flags_left_once_one_is_called():
    # three kept flags: f0's absence soaked far past its rule-out, f1 and f2 short of it; at
    # alpha / k each, f1 and f2 still need the x8 rule-out at alpha / 3; stepping down (Holm),
    # f0 called at alpha / 3 leaves them alpha / 2, so they need less soak
    keep = 0b0111
    data = {0b1111: (40, 40 * MTTF), 0b1110: (0, 80 * MTTF), 0b1101: (0, 20 * MTTF), 0b1011: (0, 20 * MTTF)}

    def needs(least: int) -> dict[int, float]:
        search = _search_with(data, settings=Settings(confidence=0.99))
        H, E = search.pooled(keep)
        factor = (8.0, search.alpha, ablation._reference_of(search, keep))
        with diagnostics(None, least):
            return dict(ablation._unrefuted(search, keep, keep, H, E, 1.0, factor)[1])
    each, stepped = needs(0), needs(2)
    assert 0 not in each and set(each) == set(stepped) == {1, 2}
    assert all(stepped[j] < each[j] for j in (1, 2))
    assert ablation._rule_out_level.__module__ == ablation.__name__   # swapped back on the way out
