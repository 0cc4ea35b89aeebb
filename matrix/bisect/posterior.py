"""The posterior over which set of flags is the trigger, and the pooled-rate tests the stages share.

A hypothesis is a set K of elements: configs containing K hang with the failing cell's signature at
one shared rate lambda >= 1/cap ("fast"), the others are "slow": rate 0 with prior weight
`slow_zero_prior`, else uniform on (0, 1/cap). Hangs of another signature only end a probe early.
With a 1/lambda prior the likelihood of every hypothesis has a closed form in (hangs, exposure)
pooled over its fast configs, so every probe of every config informs every hypothesis, and an
unknown lambda needs no plug-in estimate. `Reference` is the failing cell's own rate as lambda's posterior,
which the necessity rule-outs read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy.stats import nbinom

from .policy import DEFAULT_POLICY, Policy


class Posterior:
    """Log-posterior over every subset K of n elements, updated incrementally per observation."""

    def __init__(self, n: int, cap_s: float, slow_zero_prior: float, policy: Policy = DEFAULT_POLICY):
        if n > policy.max_elements:
            raise ValueError(
                f"{n} elements differ from the baseline; bisection handles at most "
                f"{policy.max_elements}: move more flags to the baseline or fix them in the cell"
            )
        self.n = n
        self.cap = cap_s
        self.pi0 = slow_zero_prior
        self.K = np.arange(1 << n, dtype=np.int64)
        self.size = np.zeros(1 << n, dtype=np.int64)
        for i in range(n):
            self.size += (self.K >> i) & 1
        # prior: triggers are usually one to three flags: every set of 1-3 flags equally likely
        # (so a pair needs no more evidence than a single flag), larger sets x0.1 per extra flag,
        # the baseline itself (the empty set) unlikely
        sizes = self.size.astype(float)
        self.log_prior = np.where(
            sizes == 0,
            math.log(policy.baseline_prior),
            np.maximum(sizes - policy.small_set, 0.0) * math.log(policy.large_set_factor),
        )
        self.log_prior -= special.logsumexp(self.log_prior)
        self.H = np.zeros(1 << n)  # target hangs pooled over each K's fast configs
        self.E = np.zeros(1 << n)  # exposure pooled likewise
        self.slow_in_fast = np.zeros(1 << n)  # sum of log L_slow over configs that are fast for K
        self.slow_total = 0.0
        self.cells: dict[int, tuple[int, float]] = {}

    def subsets_of(self, mask: int) -> np.ndarray:
        return (self.K & ~mask) == 0

    def log_slow(self, hangs: int, exposure: float) -> float:
        if exposure <= 0:
            return 0.0 if hangs == 0 else -math.inf
        x = exposure / self.cap
        if hangs == 0:
            uniform = -math.expm1(-x) / x  # mean of exp(-mu E) over mu ~ U(0, 1/cap)
            return math.log(self.pi0 + (1 - self.pi0) * uniform)
        if self.pi0 >= 1.0:
            return -math.inf
        log_uniform = (
            math.log(self.cap)
            + special.gammaln(hangs + 1)
            + math.log(max(special.gammainc(hangs + 1, x), 1e-300))
            - (hangs + 1) * math.log(exposure)
        )
        return math.log(1 - self.pi0) + log_uniform

    def set_cap(self, cap_s: float) -> None:
        """Move the cap (a default cap follows the pooled MTTF): slow terms are recomputed."""
        self.cap = cap_s
        self.slow_in_fast[:] = 0.0
        self.slow_total = 0.0
        for mask, (h, e) in self.cells.items():
            value = self.log_slow(h, e)
            self.slow_in_fast[self.subsets_of(mask)] += value
            self.slow_total += value

    def observe(self, mask: int, hangs: int, exposure: float) -> None:
        old_h, old_e = self.cells.get(mask, (0, 0.0))
        new_h, new_e = old_h + hangs, old_e + exposure
        delta = self.log_slow(new_h, new_e) - self.log_slow(old_h, old_e)
        self.cells[mask] = (new_h, new_e)
        sel = self.subsets_of(mask)
        self.H[sel] += hangs
        self.E[sel] += exposure
        self.slow_in_fast[sel] += delta
        self.slow_total += delta

    def log_fast(self, H: np.ndarray, E: np.ndarray) -> np.ndarray:
        """log of the integral over lambda >= 1/cap of lambda^(H-1) exp(-lambda E)."""
        out = np.full(H.shape, -np.inf)
        pos = H > 0
        Hp, Ep = H[pos], np.maximum(E[pos], 1e-9)
        tail = np.maximum(special.gammaincc(Hp, Ep / self.cap), 1e-300)
        out[pos] = special.gammaln(Hp) + np.log(tail) - Hp * np.log(Ep)
        zero = ~pos
        # no hang at all yet: only the cap bounds lambda from below
        out[zero] = np.log(np.maximum(special.exp1(np.maximum(E[zero], 1e-9) / self.cap), 1e-300))
        return out

    def log_posterior(self) -> np.ndarray:
        lp = self.log_prior + self.log_fast(self.H, self.E) + (self.slow_total - self.slow_in_fast)
        lp = np.where(np.isfinite(lp), lp, -np.inf)
        top = lp.max()
        if not np.isfinite(top):
            raise RuntimeError("no hypothesis explains the observations")
        w = np.exp(lp - top)
        return np.log(w / w.sum())


def subset_sums(p: np.ndarray, n: int) -> np.ndarray:
    """f(c) = sum of p(K) over K subset of c, for every c (subset-sum transform)."""
    f = p.copy()
    for i in range(n):
        bit = 1 << i
        view = f.reshape(-1, 2 * bit)
        view[:, bit:] += view[:, :bit]
    return f


def p_as_fast(hangs: int, exposure: float, pool_hangs: float, pool_exposure: float) -> float:
    """P(at most `hangs` hangs in `exposure` | the rate of a pool of configs with `pool_hangs` hangs
    in `pool_exposure`): the predictive tail with lambda ~ Gamma(pool_hangs, pool_exposure), a
    negative binomial; (E / (E + e))^H without a hang. Small: this config is slower than the pool."""
    if exposure <= 0:
        return 1.0
    return float(nbinom.cdf(hangs, max(pool_hangs, 1e-9), pool_exposure / (pool_exposure + exposure)))


def exposure_until(hangs: int, exposure: float, pool_hangs: float, pool_exposure: float, level: float) -> float:
    """The total exposure at which `hangs` hangs would bring p_as_fast down to `level`."""
    return exposure_at_level(
        lambda t: p_as_fast(hangs, t, pool_hangs, pool_exposure), exposure, pool_exposure / max(pool_hangs, 1.0), level
    )


def exposure_at_level(p_of: Callable[[float], float], exposure: float, mttf: float, level: float) -> float:
    """The exposure, at least `exposure`, at which `p_of` (falling with exposure) reaches `level`:
    doubled from an MTTF, then 40 halvings (a hair long rather than short)."""
    lo, hi = exposure, max(exposure, mttf)
    while p_of(hi) > level:
        lo, hi = hi, 2.0 * hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if p_of(mid) > level else (lo, mid)
    return hi


@dataclass(frozen=True)
class Reference:
    """The failing cell's rate that the necessity rule-outs read, as lambda's posterior: a mixture of
    Gamma(hangs, exposures[i]) with weights[i] (summing to 1; the ablation passes one, from the pool
    of the failing cell and the removals that look like it, `modifier_reads.reference_pool`)."""

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
