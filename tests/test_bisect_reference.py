"""The failing cell's rate the necessity rule-outs read (matrix/bisect/reference.py)."""

from __future__ import annotations

import numpy as np
import pytest

from soakmatrix.matrix.bisect import Element, Settings
from soakmatrix.matrix.bisect.modifiers import reference_pool
from soakmatrix.matrix.bisect.reference import reference_rate
from soakmatrix.matrix.bisect.search import Search

MTTF = 600.0


def _search(data: dict[int, tuple[int, float]], n: int = 6) -> Search:
    search = Search({f"f{i}": True for i in range(n)}, [Element(f"f{i}", True, False) for i in range(n)],
                    None, Settings(confidence=0.99), None, None, lambda f: 1, None)
    for mask, (hangs, exposure) in data.items():
        cs = search.stats_of(mask)
        cs.hangs, cs.exposure_s = hangs, exposure
    return search


def _pooled_no_hang(rows: list[tuple[int, float]], t: float) -> float:
    h, e = sum(r[0] for r in rows), sum(r[1] for r in rows)
    return (e / (e + t)) ** h


def test_configs_that_agree_pool_into_one_rate():
    # the failing cell and four removals of flags outside the set {f0}, all at one rate
    data = {0b111111: (10, 10 * MTTF), 0b111101: (5, 4.6 * MTTF), 0b111011: (4, 4.4 * MTTF),
            0b110111: (5, 5.3 * MTTF), 0b101111: (4, 3.9 * MTTF)}
    ref = reference_rate(_search(data), 0b000001)
    assert ref.hangs == 28
    for t in (5 * MTTF, 20 * MTTF):
        assert ref.p_no_hang(t) == pytest.approx(_pooled_no_hang(list(data.values()), t), rel=0.1)


def test_a_modifiers_slow_configs_do_not_slow_the_failing_cells_rate():
    # f3 slows the hang x8: the failing cell without it and the set alone (both lack it) hang
    # rarely; pooled with them the failing cell would look 2x slower than it is
    fast = {0b111111: (12, 12 * MTTF), 0b111101: (5, 5.2 * MTTF), 0b101111: (4, 3.8 * MTTF)}
    slow = {0b110111: (2, 17 * MTTF), 0b000001: (2, 15 * MTTF)}
    ref = reference_rate(_search({**fast, **slow}), 0b000001)
    t = 6 * MTTF
    assert ref.p_no_hang(t) == pytest.approx(_pooled_no_hang(list(fast.values()), t), rel=0.15)
    assert ref.p_no_hang(t) < 0.5 * _pooled_no_hang(list({**fast, **slow}.values()), t)


def test_the_exposure_until_a_level_inverts_no_hang():
    ref = reference_rate(_search({0b111111: (8, 8 * MTTF), 0b111110: (3, 2.5 * MTTF)}), 0b000001)
    t = ref.exposure_until(MTTF, 0.001)
    assert ref.p_no_hang(t) == pytest.approx(0.001, rel=1e-3)
    assert ref.exposure_until(2 * t, 0.001) == 2 * t
    # one more hang of the failing cell narrows the rate: less exposure to the same level
    assert ref.plus_cell_hang(MTTF).exposure_until(MTTF, 0.001) < t


def _innocent_soaks(rng: np.random.Generator, n: int) -> dict[int, tuple[int, float]]:
    """The failing cell soaked to 8 hangs, and each of n - 1 innocent removals soaked the way the
    modifier verdicts soak them: until 4 hangs, or sooner once its first two hangs came quickly."""
    full = (1 << n) - 1
    data = {full: (8, float(rng.gamma(8, MTTF)))}
    for j in range(1, n):
        times = rng.exponential(MTTF, 4)
        stop = 2 if times[:2].sum() < 1.2 * MTTF else 4
        data[full & ~(1 << j)] = (stop, float(times[:stop].sum()))
    return data


def test_the_rule_out_errs_less_than_with_the_pool_chosen_by_its_data():
    # a flag as fast as the failing cell without it, soaked without a hang to the rule-out's length
    # at the level (read against the reference), is missed with probability exp(-lambda t); over
    # many runs that averages near the level with the shared rate, and further above it with the
    # pool that takes only the removals that look like the failing cell
    level = 0.003
    rng = np.random.default_rng(7)
    mixture, chosen = [], []
    for _ in range(1500):
        search = _search(_innocent_soaks(rng, 6))
        mixture.append(np.exp(-reference_rate(search, 0b000001).exposure_until(0.0, level) / MTTF))
        h, e = reference_pool(search, 0b000001)
        chosen.append(np.exp(-e * (level ** (-1.0 / h) - 1.0) / MTTF))
    assert np.mean(mixture) <= 1.2 * level
    assert np.mean(chosen) > 1.04 * np.mean(mixture)
