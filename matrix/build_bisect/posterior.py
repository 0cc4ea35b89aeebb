"""The posterior over the change point: which build is the first bad one.

Hypothesis J (0 <= J < n): builds J..n-1 hang with the target signature at one shared rate lambda,
builds before J never do. J = 0 says the good build hangs too: not a regression. Evidence is pooled
per build (target hangs, exposure), so every probe of every build informs every hypothesis. With a
1/lambda prior the rate integrates out in closed form: the likelihood of J is
Gamma(H_J) / E_J^H_J, H_J and E_J the hangs and exposure pooled over builds J..n-1, and zero when a
build before J hung with the target signature (a hang is conclusive, a pass only bounds). The
1/lambda prior is the scale-invariant one, so the answer does not depend on the unit of time and the
posterior holds its stated confidence across MTTFs (the benchmark measures it).

A build that could not be tested merges with the next testable one: their hypotheses have the same
likelihood whatever is soaked, so the posterior is read over such **groups** ("the first bad build
is one of X..Y").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special


@dataclass
class BuildEvidence:
    probes: int = 0
    hangs: int = 0               # hangs with the target signature
    other_hangs: int = 0         # hangs of any other signature (ended a probe, counted apart)
    exposure_s: float = 0.0
    gpu_hours: float = 0.0
    untestable: int = 0          # probes that could not install or start the build

    @property
    def tested(self) -> bool:
        return self.probes > self.untestable

    @property
    def is_untestable(self) -> bool:
        return self.untestable > 0 and not self.tested


class ChangePointPosterior:
    def __init__(self, n: int, not_regression_prior: float = 0.05):
        if n < 2:
            raise ValueError(f"build bisection needs at least two builds (a good one and a bad one), got {n}")
        if not 0.0 <= not_regression_prior < 1.0:
            raise ValueError(f"not_regression_prior must be in [0, 1), got {not_regression_prior}")
        self.n = n
        prior = np.full(n, (1.0 - not_regression_prior) / (n - 1))
        prior[0] = not_regression_prior
        with np.errstate(divide="ignore"):
            self.log_prior = np.log(prior)
        self.builds = [BuildEvidence() for _ in range(n)]

    # -- evidence ---------------------------------------------------------------------------------

    def observe(self, index: int, outcome: str, target: bool, exposure_s: float, gpu_hours: float) -> None:
        """One probe of build `index`: outcome hang|passed|untestable; `target` whether a hang had the
        target signature."""
        b = self.builds[index]
        b.probes += 1
        b.gpu_hours += gpu_hours
        if outcome == "untestable":
            b.untestable += 1
            return
        b.exposure_s += exposure_s
        if outcome == "hang":
            if target:
                b.hangs += 1
            else:
                b.other_hangs += 1

    def hangs(self) -> np.ndarray:
        return np.array([b.hangs for b in self.builds], dtype=float)

    def exposure(self) -> np.ndarray:
        return np.array([b.exposure_s for b in self.builds], dtype=float)

    def lowest_bad(self) -> int | None:
        """The oldest build seen to hang with the target signature: every build from it on is bad."""
        return next((i for i, b in enumerate(self.builds) if b.hangs), None)

    def known_bad_pool(self) -> tuple[float, float]:
        """(hangs, exposure) pooled over the builds every hypothesis left says are bad."""
        low = self.lowest_bad()
        if low is None:
            return 0.0, 0.0
        return float(self.hangs()[low:].sum()), float(self.exposure()[low:].sum())

    # -- the posterior ----------------------------------------------------------------------------

    def log_likelihood(self) -> np.ndarray:
        h = self.hangs()
        e = self.exposure()
        suffix_h = np.cumsum(h[::-1])[::-1]
        suffix_e = np.cumsum(e[::-1])[::-1]
        out = np.zeros(self.n)
        pooled = suffix_h > 0
        out[pooled] = special.gammaln(suffix_h[pooled]) - suffix_h[pooled] * np.log(suffix_e[pooled])
        # with no target hang anywhere (before calibration) the rate is not identified: the prior
        low = self.lowest_bad()
        if low is not None:
            out[low + 1:] = -math.inf
        return out

    def probabilities(self) -> np.ndarray:
        """P(J = i) for each build i."""
        logp = self.log_prior + self.log_likelihood()
        logp -= special.logsumexp(logp)
        return np.exp(logp)

    def groups(self) -> list[tuple[int, int]]:
        """Hypotheses no probe can tell apart, as (first, last) build indices: a run of untestable
        builds and the next testable one. Every other build is its own group."""
        out, start = [], 0
        for i, b in enumerate(self.builds):
            if b.is_untestable and i < self.n - 1:
                continue
            out.append((start, i))
            start = i + 1
        if start < self.n:
            out.append((start, self.n - 1))
        return out

    def group_probabilities(self) -> tuple[list[tuple[int, int]], np.ndarray]:
        groups = self.groups()
        p = self.probabilities()
        return groups, np.array([p[a:b + 1].sum() for a, b in groups])

    def group_pools(self, groups: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(hangs, exposure) that each group's hypotheses pool over the builds they call bad (the
        same for every hypothesis of a group: the untestable builds in it have neither)."""
        suffix_h = np.cumsum(self.hangs()[::-1])[::-1]
        suffix_e = np.cumsum(self.exposure()[::-1])[::-1]
        first = [a for a, _ in groups]
        return suffix_h[first], suffix_e[first]
