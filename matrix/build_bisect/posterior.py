"""The posterior over the change point: which build is the first bad one.

Hypothesis J (0 <= J < n): builds J..n-1 hang with the target signature at one shared rate lambda,
builds before J never do. J = 0 says the good build hangs too: not a regression. Evidence is pooled
per build (target hangs, exposure), so every probe of every build informs every hypothesis. With a
1/lambda prior the rate integrates out in closed form: the likelihood of J is
Gamma(H_J) / E_J^H_J, H_J and E_J the hangs and exposure pooled over builds J..n-1, and zero when a
build before J hung with the target signature (a hang is conclusive, a pass only bounds). The
1/lambda prior is the scale-invariant one, so the answer does not depend on the unit of time and the
posterior holds its stated confidence across MTTFs (the benchmark measures it).

**Rate changes.** Beside that clean regression (the old rate is 0), each J > 0 also stands for a
rate change: builds before J hang too, at rho x the rate after, rho <= 1 / `Tuning.min_ratio`. With
rho on a log-uniform grid (prior `Tuning.rate_change_prior` over the grid) and the rate after
integrated out as above, the likelihood of (J, rho) is Gamma(H) rho^H0 / (E1 + rho E0)^H: H all the
hangs, H0 and E0 the hangs and exposure before J, E1 the exposure from J on. A hang below J no
longer rules J out; it makes the rate change likelier than the clean regression. J = 0 is one rate
everywhere: the hang is old.

A build that could not be tested merges with the next testable one: their hypotheses have the same
likelihood whatever is soaked, so the posterior is read over such **groups** ("the first bad build
is one of X..Y").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from .tuning import Tuning


@dataclass
class BuildEvidence:
    probes: int = 0
    hangs: int = 0  # hangs with the target signature
    other_hangs: int = 0  # hangs of any other signature (ended a probe, counted apart)
    exposure_s: float = 0.0
    gpu_hours: float = 0.0
    untestable: int = 0  # probes that could not install or start the build

    @property
    def tested(self) -> bool:
        return self.probes > self.untestable

    @property
    def is_untestable(self) -> bool:
        return self.untestable > 0 and not self.tested


class ChangePointPosterior:
    def __init__(self, n: int, not_regression_prior: float = 0.05, tuning: Tuning | None = None):
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
        self.tuning = tuning or Tuning()
        # the old rate's share per component: 0 (the clean regression), then the rate-change grid
        self.rho = np.concatenate([[0.0], self.tuning.shares()]) if self.tuning.rate_change_prior > 0 else np.zeros(1)
        rest = len(self.rho) - 1
        with np.errstate(divide="ignore"):
            self.log_component_prior = np.log(
                np.concatenate(
                    [[1.0 - self.tuning.rate_change_prior], np.full(rest, self.tuning.rate_change_prior / max(rest, 1))]
                )
            )

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

    def pools(self, extra: tuple[int, float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(H, E) per (J, component): the hangs and the rate-weighted exposure each hypothesis pools
        (clean regression: builds J.. only; rate change rho: every build, those before J at rho).
        `extra` = (upto, hangs, exposure) adds a bad build's hangs and load to every J <= upto."""
        h, e = self.hangs(), self.exposure()
        suffix_h, suffix_e = np.cumsum(h[::-1])[::-1], np.cumsum(e[::-1])[::-1]
        before_e = e.sum() - suffix_e
        hangs = np.where(self.rho[None, :] > 0, h.sum(), suffix_h[:, None])
        exposure = suffix_e[:, None] + self.rho[None, :] * before_e[:, None]
        if extra is not None:
            upto, more_h, more_e = extra
            hangs[: upto + 1] += more_h
            exposure[: upto + 1] += more_e
        return hangs, exposure

    def log_weights(self) -> np.ndarray:
        """log P(J, component) up to a constant: the prior times the likelihood, the rate integrated out."""
        h = self.hangs()
        out = self.log_prior[:, None] + self.log_component_prior[None, :]
        if not h.any():
            return out  # with no target hang anywhere (before calibration) the rate is not identified
        hangs, exposure = self.pools()
        before_h = h.sum() - np.cumsum(h[::-1])[::-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            lik = np.where(
                hangs > 0, special.gammaln(np.maximum(hangs, 1.0)) - hangs * np.log(np.maximum(exposure, 1e-300)), 0.0
            )
            old = np.where(before_h[:, None] > 0, before_h[:, None] * np.log(self.rho[None, :]), 0.0)
        return out + lik + old

    def log_likelihood(self) -> np.ndarray:
        """log P(evidence | J), each J's components mixed with their prior."""
        lw = self.log_weights() - self.log_prior[:, None]
        with np.errstate(divide="ignore"):
            return special.logsumexp(lw, axis=1)

    def component_probabilities(self) -> np.ndarray:
        """P(J, component): column 0 the clean regression, the rest the rate-change grid."""
        lw = self.log_weights()
        return np.exp(lw - special.logsumexp(lw))

    def probabilities(self) -> np.ndarray:
        """P(J = i) for each build i."""
        return self.component_probabilities().sum(axis=1)

    def rate_change_probability(self) -> float:
        """P(the hang was there before the change point, at a lower rate), J = 0 left out."""
        p = self.component_probabilities()
        return float(p[1:, 1:].sum())

    def group_passes(
        self, groups: list[tuple[int, int]], length: float, extra: tuple[int, float, float] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per group: P(J in it, and a soak of `length` passes) when the soaked build is bad under it
        (at or above its first build), and when it is good (below: the old rate, rho x; 1 for the clean
        regression). The rate is integrated out per hypothesis: (E / (E + m L))^H. `extra` as in pools."""
        return self.passes(groups)(length, extra)

    def passes(self, groups: list[tuple[int, int]]):
        """`group_passes` for one state of the evidence, as a function of (length, extra): the
        posterior and the pools computed once (the planner asks it for many lengths)."""
        p = self.component_probabilities()
        first = [a for a, _ in groups]
        pools: dict[tuple[int, float, float] | None, tuple[np.ndarray, np.ndarray]] = {None: self.pools()}

        def at(length: float, extra: tuple[int, float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
            if extra not in pools:
                pools[extra] = self.pools(extra)
            hangs, exposure = pools[extra]
            with np.errstate(divide="ignore", invalid="ignore"):
                bad = np.where(exposure > 0, (exposure / (exposure + length)) ** hangs, 0.0)
                good = np.where(exposure > 0, (exposure / (exposure + self.rho[None, :] * length)) ** hangs, 1.0)
            return np.add.reduceat((p * bad).sum(axis=1), first), np.add.reduceat((p * good).sum(axis=1), first)

        return at

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
        return groups, np.array([p[a : b + 1].sum() for a, b in groups])

    def group_pools(self, groups: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(hangs, exposure) that each group's hypotheses pool over the builds they call bad (the
        same for every hypothesis of a group: the untestable builds in it have neither)."""
        suffix_h = np.cumsum(self.hangs()[::-1])[::-1]
        suffix_e = np.cumsum(self.exposure()[::-1])[::-1]
        first = [a for a, _ in groups]
        return suffix_h[first], suffix_e[first]
