"""The failing cell's rate the necessity rule-outs read, shared by every config that holds the set.

The rule-out of "without flag k the hang is at most F x slower than the failing cell" needs the
failing cell's rate. The failing cell alone (8-12 hangs) leaves its predictive wide; every config
that holds the set and lacks only flags outside it hangs at that same rate unless one of the flags
it lacks is a modifier. Choosing which of those configs to pool by their own data (those that do
not look slower) kept the lucky-fast ones and left the slow-looking ones out: the pooled rate came
out some 11 % fast, and the rule-out erred at about twice its level (docs/design/alternatives.md).

So no config is chosen: the rate is one lambda shared by every config that holds the set, under a
mixture over which flag outside the set (if any) multiplies the rate of the configs lacking it by
1 / x, x on a log grid (MODIFIER_FACTORS), "none" at prior 1 - modifier_prior. With lambda's
scale-free prior 1 / lambda, shared by every hypothesis, each hypothesis's posterior of lambda is
Gamma(all hangs, the exposure of the configs with the flag + that of the configs without it / x),
weighted by its marginal likelihood; the predictive of "no hang in t" is the weighted sum of
(E / (E + t))^H. A slow-looking innocent removal is then kept by "none", which outweighs "that
flag is a modifier" until its data say so; only "a modifier, x2" and up discount it a little,
so the rule-out still errs a little above its level (innocent removals soaked as the modifier
verdicts soak them: 1.18 x the level at 0.003, the chosen pool 1.24 x, every config pooled 1.09 x;
tests/test_bisect_reference.py). The grid holds slowdowns only: with x 1/4 and 1/2 as well (a flag
whose removal speeds the hang) every 10-minute row cost 1-2 % more.

Off by default (ablation.MIXTURE_REFERENCE), measured (docs/design/alternatives.md): it
cuts the rule-out's excess error by three quarters (n=12, k=2, 10 min +x8, 4000 runs: the x8
modifier called necessary in 18 runs, not 32; at the level, 13) and seed 002 reads 0.965, not
0.959 (2000 runs), but every 10-minute row costs 0.3-3.3 % more (300 seeds); with Holm's step-down
(ablation.HOLM_LEAST = 2) on top to win that back, the k = 3 rows gain up to 4 % and the others lose
up to 4.3 %, seed 002 reads 0.954, and n=10, k=2, 38 min +x8 exact 0.987.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import logsumexp

from .posterior import exposure_at_level

if TYPE_CHECKING:
    from .search import Search

MODIFIER_FACTORS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # x: the rate without a modifier is lambda / x


@dataclass(frozen=True)
class Reference:
    """lambda's posterior: a mixture of Gamma(hangs, exposures[i]) with weights[i] (summing to 1)."""

    hangs: float
    exposures: np.ndarray
    weights: np.ndarray

    def p_no_hang(self, exposure: float) -> float:
        """P(no hang in `exposure` at lambda): small when a config that did not hang in it is slower."""
        if exposure <= 0:
            return 1.0
        e = self.exposures
        return float(np.dot(self.weights, np.exp(self.hangs * (np.log(e) - np.log(e + exposure)))))

    def exposure_until(self, exposure: float, level: float) -> float:
        """The exposure (at least `exposure`) at which no hang would bring p_no_hang down to `level`."""
        return exposure_at_level(self.p_no_hang, exposure, self.mttf(), level)

    def mttf(self) -> float:
        """The failing cell's MTTF, the exposures' mean over the hangs."""
        return float(np.dot(self.weights, self.exposures)) / max(self.hangs, 1.0)

    def plus_cell_hang(self, exposure: float) -> Reference:
        """The reference once the failing cell (in every hypothesis's pool) hangs once more in `exposure`."""
        return Reference(self.hangs + 1, self.exposures + exposure, self.weights)


def reference_rate(search: Search, minimal_mask: int) -> Reference:
    """lambda's posterior from every config that holds `minimal_mask` (module docstring)."""
    rows = [(m, cs.hangs, cs.exposure_s) for m, cs in search.configs.items()
            if (m & minimal_mask) == minimal_mask and cs.exposure_s > 0]
    masks = np.array([m for m, _, _ in rows], dtype=object)
    hangs = np.array([h for _, h, _ in rows], dtype=float)
    exposure = np.array([e for _, _, e in rows], dtype=float)
    total_h = float(hangs.sum())
    outside = [j for j in range(search.n) if (search.full & ~minimal_mask) >> j & 1]
    prior_mod = min(max(search.s.modifier_prior, 0.0), 0.999)
    log_w = [np.log(1.0 - prior_mod) - total_h * np.log(exposure.sum())]
    exposures = [float(exposure.sum())]
    factors = np.array(MODIFIER_FACTORS)
    if outside and prior_mod > 0:
        log_each = np.log(prior_mod / (len(outside) * len(factors)))
        for j in outside:
            lacking = np.array([not (int(m) >> j & 1) for m in masks], dtype=bool)
            e_with, e_without = exposure[~lacking].sum(), exposure[lacking].sum()
            h_without = hangs[lacking].sum()
            eff = e_with + e_without / factors
            log_w += list(log_each - total_h * np.log(eff) - h_without * np.log(factors))
            exposures += list(eff)
    log_w = np.array(log_w)
    return Reference(total_h, np.array(exposures), np.exp(log_w - logsumexp(log_w)))
