"""Every hang signature on its own: one posterior per signature, all fed by the same probes, and
each signature's verdict read from its posterior.

A probe that hung with signature A is, for every other signature B, a pass censored at the hang:
B's hang process was watched for that long and did not fire (the signatures' hangs are independent
Poisson processes on a build, so the first to fire ends the probe and says nothing else about the
others). A signature first seen late gets a posterior replayed from every probe before it, so it
misses none of them. The verdicts are pure functions of a posterior:

* `old`: the good build itself is the answer (present at the last-good end: it hangs there too, at
  a rate within `Tuning.min_ratio` of the bad builds'), at the stated confidence, or at
  `Tuning.old_posterior` once it hung `Tuning.old_hangs` times on the good build;
* `regression`: the first bad build, no hang of it below;
* `rate_change`: a change point with hangs of it below, at a rate at least `min_ratio` times lower;
* `undecided`: no answer reached the confidence (the likeliest so far, with its posterior);
* `not_reproduced`: the named target never hung.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from soakmatrix.matrix.contracts.stats import mttf_estimate

from .oracle import HANG
from .posterior import ChangePointPosterior
from .tuning import Tuning

OLD = "old"
REGRESSION = "regression"
RATE_CHANGE = "rate_change"
UNDECIDED = "undecided"
NOT_REPRODUCED_VERDICT = "not_reproduced"
DECIDED = (OLD, REGRESSION, RATE_CHANGE)


@dataclass(frozen=True)
class SignatureAnswer:
    signature: str
    verdict: str  # old | regression | rate_change | undecided | not_reproduced
    first: int | None  # the likeliest group's first and last build (the change point)
    last: int | None
    posterior: float  # of that group
    hangs: int  # of this signature, on every build
    hangs_on_bad_build: int  # on the newest build
    hangs_before: int  # on builds below the change point
    mttf_after_s: float  # pooled from the change point on (nan without a hang there)
    mttf_before_low_s: float | None  # below the change point: MTTF at least this, at the confidence
    target: bool = False  # the headline's signature
    crash: bool = False  # a crash's signature: reported, never the target unless named


def verdict(
    signature: str,
    post: ChangePointPosterior,
    aim: float,
    confidence: float,
    *,
    target: bool = False,
    crash: bool = False,
    named: bool = False,
) -> SignatureAnswer:
    """The answer for one signature from its posterior: decided when one group holds `aim`. A
    `named` target is answered old at `aim` only (the headline states the confidence asked)."""
    hangs, exposure = post.hangs(), post.exposure()
    if not hangs.any():
        return SignatureAnswer(
            signature, NOT_REPRODUCED_VERDICT, None, None, 0.0, 0, 0, 0, math.nan, None, target, crash
        )
    groups, mass = post.group_probabilities()
    k = int(mass.argmax())
    lo, hi = groups[k]
    relaxed = not named and hangs[0] >= post.tuning.old_hangs and mass[k] >= post.tuning.old_posterior
    if lo == 0 and (mass[k] >= aim or relaxed):
        kind = OLD
        lo = hi = 0
    elif mass[k] < aim:
        kind = UNDECIDED
    else:
        kind = RATE_CHANGE if hangs[:lo].sum() else REGRESSION
    before_h, before_e = int(hangs[:lo].sum()), float(exposure[:lo].sum())
    after_h, after_e = int(hangs[lo:].sum()), float(exposure[lo:].sum())
    posterior = float(mass[k])
    before_low = mttf_estimate(before_h, before_e, confidence).low_s if lo > 0 and before_e > 0 else None
    return SignatureAnswer(
        signature,
        kind,
        lo,
        hi,
        posterior,
        int(hangs.sum()),
        int(hangs[-1]),
        before_h,
        after_e / after_h if after_h else math.nan,
        before_low,
        target,
        crash,
    )


class SignatureBook:
    """The probes so far and one posterior per signature seen (or named), every probe in each.
    `blank` sees every probe with no signature as its target: the evidence table before any hang."""

    def __init__(self, n: int, not_regression_prior: float, tuning: Tuning | None = None):
        self.n, self.prior, self.tuning = n, not_regression_prior, tuning or Tuning()
        self.log: list[tuple[int, str, str | None, float, float]] = []
        self.posteriors: dict[str, ChangePointPosterior] = {}
        self.crashes: set[str] = set()  # signatures seen as crashes
        self.hung: set[str] = set()  # signatures seen as hangs (not crashes)
        self.first_seen: list[str] = []
        self.blank = ChangePointPosterior(n, not_regression_prior, self.tuning)
        self.unclaimed: dict[int, tuple[int, float]] = {}  # known evidence for the first signature seen

    def add(self, signature: str, known: dict[int, tuple[int, float]] | None = None) -> ChangePointPosterior:
        """The posterior of `signature`, made (with `known` evidence, and every probe so far) if new."""
        if signature not in self.posteriors:
            post = ChangePointPosterior(self.n, self.prior, self.tuning)
            for index, (h, e) in (known or {}).items():
                post.builds[index].hangs += int(h)
                post.builds[index].exposure_s += float(e)
            for index, outcome, sig, exposure_s, gpu_hours in self.log:
                post.observe(index, outcome, sig == signature, exposure_s, gpu_hours)
            self.posteriors[signature] = post
        return self.posteriors[signature]

    def observe(
        self,
        index: int,
        outcome: str,
        signature: str | None,
        exposure_s: float,
        gpu_hours: float,
        crashed: bool = False,
    ) -> None:
        """One probe's answer, into every posterior (a new signature's first replays the probes before)."""
        hung = signature if outcome == HANG and signature is not None else None
        if hung is not None:
            (self.crashes if crashed else self.hung).add(hung)
            if hung not in self.first_seen:
                self.first_seen.append(hung)
            known, self.unclaimed = (self.unclaimed, {}) if not crashed else ({}, self.unclaimed)
            self.add(hung, known)
        self.log.append((index, outcome, hung, exposure_s, gpu_hours))
        for sig, post in self.posteriors.items():
            post.observe(index, outcome, sig == hung, exposure_s, gpu_hours)
        self.blank.observe(index, outcome, False, exposure_s, gpu_hours)

    def candidates(self) -> list[str]:
        """Signatures that could be the regression when none is named: seen on the newest build, not
        crashes, in the order first seen."""
        return [s for s in self.first_seen if s in self.hung and self.posteriors[s].builds[-1].hangs > 0]
