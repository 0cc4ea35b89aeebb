"""Statistics of intermittent hangs under the exponential model (REFERENCE.md, "Statistics").

Hangs of one configuration arrive as a Poisson process in exposure (seconds under load), so exposure
adds up across runs and across probes of the same configuration. A hang with the expected signature
is conclusive; a pass only bounds the rate. Everything here is a pure function of counts and seconds.
scipy (the `reports` and `bisect` extras) loads in the functions that need its distributions, so the
core install (`watch`, the pytest plugin) imports this module without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def mttf_lower_bound(exposure_s: float, confidence: float = 0.95) -> float:
    """With no hang in `exposure_s`, MTTF exceeds this at `confidence` (rule of three at 0.95).

    The one-sided bound solves exp(-T/M) = 1 - c, i.e. M = T / ln(1/(1-c)); at 0.95 it is T/3.
    """
    _check_confidence(confidence)
    return exposure_s / -math.log1p(-confidence) if exposure_s > 0 else 0.0


def rate_upper_bound(exposure_s: float, confidence: float = 0.95) -> float:
    """Upper bound on the hang rate (per second) after zero hangs: the rule of three, 3/T at 0.95."""
    _check_confidence(confidence)
    return -math.log1p(-confidence) / exposure_s if exposure_s > 0 else math.inf


def soak_for_detection(mttf_s: float, probability: float) -> float:
    """Soak length that sees a config of MTTF `mttf_s` hang with `probability`: M ln(1/(1-p))."""
    _check_confidence(probability)
    return mttf_s * -math.log1p(-probability)


def soak_for_probes(mttf_s: float, confidence: float, probes: int) -> float:
    """Per-probe soak so that `probes` probes together miss a hang with probability <= 1 - c
    (Bonferroni: each probe may miss with (1 - c) / probes)."""
    miss = (1.0 - confidence) / max(1, probes)
    return soak_for_detection(mttf_s, 1.0 - miss)


def detection_probability(mttf_s: float, soak_s: float) -> float:
    return 1.0 - math.exp(-soak_s / mttf_s) if mttf_s > 0 else 1.0


@dataclass(frozen=True)
class MttfEstimate:
    hangs: int
    exposure_s: float
    point_s: float  # exposure / hangs; inf without a hang
    low_s: float  # two-sided confidence interval
    high_s: float  # inf without a hang
    confidence: float

    def describe(self, fmt=None) -> str:
        fmt = fmt or (lambda s: f"{s:.0f}s")
        pct = f"{self.confidence:.0%}"
        if self.hangs == 0:
            return f"> {fmt(self.low_s)} at {pct}"
        return f"{fmt(self.point_s)} ({pct} CI {fmt(self.low_s)}-{fmt(self.high_s)})"


def mttf_estimate(hangs: int, exposure_s: float, confidence: float = 0.95) -> MttfEstimate:
    """MTTF point estimate E/r with the chi-square interval (2E/chi2(1-a/2, 2r+2), 2E/chi2(a/2, 2r)).

    REFERENCE.md writes the degrees of freedom the other way round; that interval misses the true
    MTTF far more often than a/2 on the high side (tests/test_stats.py measures it): the rate's
    exact Poisson interval is (chi2(a/2, 2r)/2E, chi2(1-a/2, 2r+2)/2E), and MTTF is its inverse.

    Without a hang there is no point estimate: the one-sided lower bound of `mttf_lower_bound`.
    """
    _check_confidence(confidence)
    if hangs < 0 or exposure_s < 0:
        raise ValueError(f"hangs and exposure must be >= 0, got {hangs}, {exposure_s}")
    if hangs == 0:
        return MttfEstimate(0, exposure_s, math.inf, mttf_lower_bound(exposure_s, confidence), math.inf, confidence)
    from scipy.stats import chi2

    a = 1.0 - confidence
    low = 2.0 * exposure_s / chi2.ppf(1.0 - a / 2.0, 2 * hangs + 2)
    high = 2.0 * exposure_s / chi2.ppf(a / 2.0, 2 * hangs)
    return MttfEstimate(hangs, exposure_s, exposure_s / hangs, low, high, confidence)


def mttf_upper_bound(hangs: int, exposure_s: float, confidence: float = 0.95) -> float:
    """One-sided upper bound on MTTF after `hangs` hangs in `exposure_s` (inf without a hang)."""
    _check_confidence(confidence)
    if hangs == 0:
        return math.inf
    from scipy.stats import chi2

    return 2.0 * exposure_s / chi2.ppf(1.0 - confidence, 2 * hangs)


@dataclass(frozen=True)
class RateComparison:
    ratio: float  # rate of the first config / rate of the second (MTTF of second / first)
    p_value: float  # two-sided, exact conditional (binomial) test of equal rates


def compare_rates(hangs_a: int, exposure_a: float, hangs_b: int, exposure_b: float) -> RateComparison:
    """Do two configs hang at different rates? The exact conditional test: given r = a + b hangs,
    a ~ Binomial(r, E_a / (E_a + E_b)) under equal rates (a ratio of 0 or inf is possible)."""
    if exposure_a <= 0 or exposure_b <= 0:
        return RateComparison(math.nan, 1.0)
    rate_a, rate_b = hangs_a / exposure_a, hangs_b / exposure_b
    ratio = rate_a / rate_b if rate_b > 0 else (math.inf if rate_a > 0 else math.nan)
    total = hangs_a + hangs_b
    if total == 0:
        return RateComparison(ratio, 1.0)
    from scipy.stats import binomtest

    p = binomtest(hangs_a, total, exposure_a / (exposure_a + exposure_b)).pvalue
    return RateComparison(ratio, float(min(1.0, p)))


def _check_confidence(c: float) -> None:
    if not 0.0 < c < 1.0:
        raise ValueError(f"a confidence or probability must be strictly between 0 and 1, got {c}")
