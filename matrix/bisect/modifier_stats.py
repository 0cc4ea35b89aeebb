"""The statistics of the modifier verdicts: does a flag outside the set change how often the hang
comes, and by how much (modifiers.py decides what to soak; this module only reads the soaks).

A flag j is compared only between configs that differ in j alone (strata: the failing cell and it
without j, the set alone and the set plus j, ...): pooling every config with j against every one
without it mixes in the other flags' effects (with seed 002's x8 autotune left out of the set, an
innocent flag looked like a modifier in a fifth of the runs). Within a stratum the hangs split
binomially by exposure under "no effect"; the strata's sum is tested exactly (a convolution), the
ratio's interval inverts the same test, and the calls are family-wise over the flags (Holm).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats as st

if TYPE_CHECKING:
    from .search import Search


@functools.cache
def ratio_grid(low: float, high: float, points: int) -> np.ndarray:
    """The log grid the rate ratio's interval is read on (policy.ratio_low, ratio_high, ratio_points)."""
    return np.exp(np.linspace(math.log(low), math.log(high), points))


@dataclass(frozen=True)
class Comparison:
    """Rate with the flag / rate without it, in configs that differ in that flag alone."""

    ratio: float  # Mantel-Haenszel; inf when no hang without it, nan when no data
    low: float
    high: float
    p_value: float  # two-sided exact, stratified
    hangs_with: int
    hangs_without: int
    exposure_with: float
    exposure_without: float


def strata_by_config(search: Search, bit: int, within: int) -> dict[int, tuple[int, float, int, float]]:
    """(hangs, exposure) with and without `bit` for each pair of configs that contain `within`
    and differ in `bit` alone, both soaked; keyed by the config without `bit`."""
    out = {}
    for m, without in search.configs.items():
        if m & bit or (m & within) != within or without.exposure_s <= 0:
            continue
        with_ = search.configs.get(m | bit)
        if with_ is None or with_.exposure_s <= 0:
            continue
        out[m] = (with_.hangs, with_.exposure_s, without.hangs, without.exposure_s)
    return out


def strata(search: Search, bit: int, within: int) -> list[tuple[int, float, int, float]]:
    """strata_by_config's rows, in the order the configs were first soaked."""
    return list(strata_by_config(search, bit, within).values())


def _sum_pmf(ns: list[int], ps: np.ndarray) -> np.ndarray:
    """P(sum of Binomial(n_s, p_s) = x) for x = 0..sum(n), rows of `ps` being ratio values."""
    pmf = np.ones((ps.shape[0], 1))
    for s, n in enumerate(ns):
        k = np.arange(n + 1)
        part = st.binom.pmf(k[None, :], n, ps[:, s : s + 1])
        pmf = np.array([np.convolve(a, b) for a, b in zip(pmf, part, strict=True)])
    return pmf


def compare(rows: list[tuple[int, float, int, float]], confidence: float, grid: np.ndarray | None = None) -> Comparison:
    """The stratified exact comparison of the rate with and without a flag (with a ratio `grid`,
    the ratio's interval, which inverts the test over the grid: the slow part)."""
    ha = sum(r[0] for r in rows)
    hb = sum(r[2] for r in rows)
    ea = sum(r[1] for r in rows)
    eb = sum(r[3] for r in rows)
    ns = [r[0] + r[2] for r in rows if r[0] + r[2] > 0]
    used = [r for r in rows if r[0] + r[2] > 0]
    if not ns:
        return Comparison(math.nan, 0.0, math.inf, 1.0, ha, hb, ea, eb)
    num = sum(r[0] * r[3] / (r[1] + r[3]) for r in used)
    den = sum(r[2] * r[1] / (r[1] + r[3]) for r in used)
    ratio = num / den if den > 0 else math.inf
    ratios = np.concatenate([[1.0], grid]) if grid is not None else np.array([1.0])
    ea_s = np.array([r[1] for r in used])
    eb_s = np.array([r[3] for r in used])
    ps = ratios[:, None] * ea_s[None, :] / (ratios[:, None] * ea_s[None, :] + eb_s[None, :])
    pmf = _sum_pmf(ns, ps)
    upper = pmf[:, ha:].sum(axis=1)  # P(X >= observed | ratio)
    lower = pmf[:, : ha + 1].sum(axis=1)  # P(X <= observed | ratio)
    p_value = float(min(1.0, 2.0 * min(upper[0], lower[0])))
    if grid is None:
        return Comparison(ratio, math.nan, math.nan, p_value, ha, hb, ea, eb)
    a = (1.0 - confidence) / 2.0
    inside = (upper[1:] > a) & (lower[1:] > a)
    low = float(grid[inside].min()) if inside.any() else math.nan
    high = float(grid[inside].max()) if inside.any() else math.nan
    if inside.any() and inside[0]:
        low = 0.0
    if inside.any() and inside[-1]:
        high = math.inf
    return Comparison(ratio, low, high, p_value, ha, hb, ea, eb)


def p_as_strong(rows: list[tuple[int, float, int, float]], factor: float) -> float:
    """P(at most the observed hangs with the flag | rate with it = factor x without), stratified:
    small when the flag (or group) cannot be an x factor modifier."""
    used = [r for r in rows if r[0] + r[2] > 0]
    if not used:
        return 1.0
    ps = np.array([[factor * r[1] / (factor * r[1] + r[3]) for r in used]])
    pmf = _sum_pmf([r[0] + r[2] for r in used], ps)[0]
    return float(pmf[: sum(r[0] for r in used) + 1].sum())


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down: which hypotheses are rejected, family-wise at `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def comparisons(search: Search, minimal_mask: int, interval: bool = True) -> dict[int, Comparison]:
    """Each flag outside the set: its stratified comparison within configs that hold the set."""
    out = {}
    for j in range(search.n):
        bit = 1 << j
        if minimal_mask & bit:
            continue
        p = search.policy
        grid = ratio_grid(p.ratio_low, p.ratio_high, p.ratio_points) if interval else None
        out[j] = compare(strata(search, bit, minimal_mask), search.s.confidence, grid)
    return out


def called(search: Search, minimal_mask: int) -> dict[int, tuple[Comparison, bool]]:
    """Each flag outside the set: its comparison and whether Holm calls it a modifier. A flag
    whose removal makes the hang come faster is called only on policy.speedup_hangs hangs without it or
    more: a probe ends at its first hang, and one that came within seconds of the start reads as
    a large speed-up at a small p (two of six false calls over 600 seeds of n=6, k=3, MTTF 10 min
    were such, "x0.04" and "x0.00"). Holm's calls are only thinned: no false call is added."""
    comps = comparisons(search, minimal_mask)
    keys = list(comps)
    rejected = holm([comps[j].p_value for j in keys], 1.0 - search.s.confidence)
    least = search.policy.speedup_hangs
    return {j: (comps[j], r and not thin_speedup(comps[j], least)) for j, r in zip(keys, rejected, strict=True)}


def thin_speedup(c: Comparison, least_hangs: int) -> bool:
    """The comparison says the hang comes faster without the flag, on fewer than `least_hangs`
    hangs without it (policy.speedup_hangs)."""
    return c.ratio < 1 and c.hangs_without < least_hangs


def point_probability(rows: list[tuple[int, float, int, float]]) -> float:
    """P(exactly the observed hangs with the flag | no effect), one stratum: p_as_strong's tail at
    factor 1 less this is the tail above."""
    h, e, h0, e0 = rows[0]
    return float(st.binom.pmf(h, h + h0, e / (e + e0)))
