"""Build bisection: the first bad build among an ordered list, with a stated confidence.

`bisect_builds(builds, oracle, settings)` is pure: the world is reached only through the injected
oracle (`oracle.BuildOracle`). It

1. **calibrates** on the bad build (the last): soaks it, each probe to its first hang, until
   `calibration_hangs` hangs of the target signature (the first hang's, never a crash's, unless
   `signature` names it); none within `calibration_max_s` of load is `not_reproduced`;
2. keeps a **posterior over the change point per signature** (`signatures.SignatureBook`, each a
   `posterior.ChangePointPosterior`: exposure pooled per build, the rate integrated out, a clean
   regression or a rate change; a hang of another signature is, for each signature, a pass censored
   at it; untestable builds merge with the next testable one into a group). Named (`signature`),
   the target is served and the others are answered as far as its probes go; unnamed, every
   signature seen on the bad build is served in turn, likeliest regression first, until each is
   answered, and the headline is the regression among them;
3. **probes** the build and soak length that bring most information per expected GPU-hour
   (`planner.choose`): a soak ends at the first hang or at its length, the last ones being the
   length confidence demands on the build just below the likeliest first bad one;
4. **stops** when one group holds `confidence` of the posterior: one build (`found`), several
   (`range`: "the first bad build is one of X..Y", untestable builds between), or the good build
   itself (`not_a_regression`: the oldest build hangs too); or when the probe or GPU-hour budget
   runs out (`inconclusive`, with the likeliest group so far).

With `parallel` > 1 a round soaks several probes at once (wall time is rounds, not probes): the
calibration soaks as many copies of the bad build as hangs are missing, and a search round picks
each next probe on a copy of the posterior that already believes the likelier outcome of the
probes picked before it (a pass of its length, or a hang at the pooled MTTF). Only real answers
enter the posterior and the stop, so the stated confidence holds at any width; the believed
outcomes only spread a round's probes over the builds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from soakmatrix.matrix.contracts.stats import mttf_estimate, mttf_lower_bound

from .oracle import HANG, PASSED, UNTESTABLE, BuildOracle, BuildProbe, BuildProbeResult
from .planner import Choice, aim_at, choose, planning_mttf
from .posterior import ChangePointPosterior
from .result import (
    BAD_UNTESTABLE,
    FOUND,
    INCONCLUSIVE,
    NOT_A_REGRESSION,
    NOT_REPRODUCED,
    RANGE,
    RATE_CHANGE,
    BuildBisectResult,
)
from .signatures import DECIDED, OLD, REGRESSION, SignatureAnswer, SignatureBook, verdict
from .signatures import RATE_CHANGE as RATE_CHANGE_VERDICT
from .tuning import Tuning


@dataclass(frozen=True)
class BuildSettings:
    confidence: float = 0.99
    startup_s: float = 600.0  # expected install + start-up per probe (planning only)
    gpus: int = 1  # GPUs per probe (planning only; the oracle reports the cost)
    calibration_hangs: int = 2
    calibration_max_s: float = 24 * 3600.0
    not_regression_prior: float = 0.05  # prior that the good build hangs too
    signature: str | None = None  # the target; None: each signature of the bad build answered, a regression heads
    max_probes: int = 500
    # the search stops at posterior 1 - error_share x (1 - confidence): stopping right at the stated
    # confidence measured 0.983-0.993 exact (the posterior's rate is integrated under a 1/lambda
    # prior, exact only for soaks that scale with the rate; start-ups do not); 0.7 (with
    # planner.min_pooled_hangs) measured 0.989 at n = 32 and 128, MTTF 2 h, over 1000 seeds
    error_share: float = 0.5
    budget_gpu_hours: float | None = None
    # evidence from before the bisection (e.g. the history's soaks): build index -> (target hangs,
    # exposure seconds); it pools into the posterior like any probe but costs nothing here
    known: Mapping[int, tuple[int, float]] = field(default_factory=dict)
    parallel: int = 1  # probes soaked at once per round
    tuning: Tuning = field(default_factory=Tuning)  # the rate-change model's constants (tuning.py)

    def __post_init__(self):
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if not 0.0 < self.error_share <= 1.0:
            raise ValueError(f"error_share must be in (0, 1], got {self.error_share}")
        if self.calibration_hangs < 1:
            raise ValueError("calibration needs at least one hang")


class _Run:
    """One bisection's state: the signatures' posteriors, the spend, the served signature."""

    def __init__(self, builds: Sequence[str], oracle: BuildOracle, settings: BuildSettings):
        self.builds = list(builds)
        self.oracle = oracle
        self.s = settings
        self.book = SignatureBook(len(builds), settings.not_regression_prior, settings.tuning)
        self.told = settings.signature
        if self.told is not None:
            self.book.add(self.told, dict(settings.known))
        else:  # the history's evidence is of the signature it hung with: the first one seen here
            self.book.unclaimed = dict(settings.known)
        self.signature = settings.signature
        self.probes = 0
        self.rounds = 0
        self.gpu_hours = 0.0
        self.by_role: dict[str, float] = {}
        self.progress: dict[
            str | None, tuple[tuple[int, int] | None, float, int]
        ] = {}  # signature -> (likeliest, its best mass, at probe)

    @property
    def post(self) -> ChangePointPosterior:
        """The served signature's posterior (before any hang when none is named: every probe, no target)."""
        return self.book.posteriors[self.signature] if self.signature is not None else self.book.blank

    @property
    def aim(self) -> float:
        return 1.0 - self.s.error_share * (1.0 - self.s.confidence)

    def out_of_budget(self) -> bool:
        if self.probes >= self.s.max_probes:
            return True
        return self.s.budget_gpu_hours is not None and self.gpu_hours >= self.s.budget_gpu_hours

    def probe_batch(self, picks: Sequence[tuple[int, float, str]]) -> list[BuildProbeResult]:
        """Soak (build index, soak seconds, role) probes at once; every answer enters every posterior."""
        results = self.oracle.run([BuildProbe(i, self.builds[i], soak_s) for i, soak_s, _ in picks])
        self.rounds += 1
        for (index, _, role), result in zip(picks, results, strict=True):
            self.book.observe(
                index, result.outcome, result.signature, result.exposure_s, result.gpu_hours, crashed=result.crashed
            )
            self.probes += 1
            self.gpu_hours += result.gpu_hours
            self.by_role[role] = self.by_role.get(role, 0.0) + result.gpu_hours
        return results

    def calibrated(self) -> bool:
        """The bad build has hung `calibration_hangs` times with the target (unnamed:
        `Tuning.untold_calibration_hangs` times with signatures that are not crashes', one of them
        `calibration_hangs` times)."""
        if self.told is not None:
            return self.book.posteriors[self.told].builds[-1].hangs >= self.s.calibration_hangs
        hangs = [self.book.posteriors[sig].builds[-1].hangs for sig in self.book.candidates()]
        return sum(hangs) >= self.s.tuning.untold_calibration_hangs and max(hangs) >= self.s.calibration_hangs

    def enough_for_one(self) -> bool:
        return any(
            self.book.posteriors[sig].builds[-1].hangs >= self.s.calibration_hangs for sig in self.book.candidates()
        )

    def calibrate(self) -> str | None:
        """Soak the bad build to `calibration_hangs` target hangs; a status when that fails."""
        last = len(self.builds) - 1
        while not self.calibrated():
            if self.out_of_budget():
                return INCONCLUSIVE
            bad = self.book.blank.builds[last]
            left = self.s.calibration_max_s - bad.exposure_s
            if left <= 0:
                # unnamed, the extra hangs are a margin: a signature with its calibration hangs goes on
                return None if self.told is None and self.enough_for_one() else NOT_REPRODUCED
            have = 0 if self.told is None else self.book.posteriors[self.told].builds[last].hangs
            copies = min(
                self.s.parallel,
                max(1, self.s.calibration_hangs - have if self.told else self.s.tuning.untold_calibration_hangs),
            )
            # side by side, each copy may soak what is left: the whole round stays within twice the cap
            results = self.probe_batch([(last, left, "calibration")] * copies)
            if all(r.outcome == UNTESTABLE for r in results):
                return BAD_UNTESTABLE
        return None

    def answer(self, signature: str) -> SignatureAnswer:
        return verdict(
            signature,
            self.book.posteriors[signature],
            self.aim,
            self.s.confidence,
            target=signature == self.signature,
            crash=signature in self.book.crashes and signature not in self.book.hung,
            named=signature == self.told,
        )

    def serve(self) -> str | None:
        """Unnamed: the signature to serve next, the open candidate likeliest to be a regression; None
        when every candidate is answered."""
        answers = {sig: self.answer(sig).verdict for sig in self.book.candidates()}
        open_ = [sig for sig, v in answers.items() if v not in DECIDED]
        if any(v not in (OLD,) and v in DECIDED for v in answers.values()):
            # a regression is answered: the others are reported as far as the evidence goes
            return None
        if not open_:
            return None
        return max(open_, key=lambda sig: 1.0 - self.book.posteriors[sig].probabilities()[0])

    def search(self) -> str:
        while True:
            if self.told is None:
                served = self.serve()
                if served is None:
                    if not self.book.candidates():
                        return INCONCLUSIVE
                    self.signature = self.headline()
                    return FOUND
                self.signature = served
            elif self.answer(self.told).verdict in DECIDED:
                return FOUND
            if self.out_of_budget() or self.stalled():
                return INCONCLUSIVE
            picks = self.round_of_probes()
            if not picks:
                return INCONCLUSIVE
            self.probe_batch([(c.index, c.soak_s, "search") for c in picks])

    def stalled(self) -> bool:
        """The served signature's likeliest answer has not gained for `Tuning.stall_probes` probes."""
        groups, mass = self.post.group_probabilities()
        k = int(mass.argmax())
        answer, best, since = self.progress.get(self.signature, (None, -1.0, self.probes))
        if groups[k] != answer or mass[k] > best + 1e-3:
            # a new likeliest answer starts its own count: a mass an answer since refuted reached
            # (the good build's, after its first early hang) is no bar for the next one
            self.progress[self.signature] = (groups[k], float(mass[k]), self.probes)
            return False
        return self.probes - since >= self.s.tuning.stall_probes

    def headline(self) -> str:
        """Unnamed, every candidate answered: the regression (or rate change) with the most hangs on
        the bad build; none: the bad build's first signature (then old: not a regression)."""
        found = [sig for sig in self.book.candidates() if self.answer(sig).verdict in (REGRESSION, RATE_CHANGE_VERDICT)]
        pool = found or self.book.candidates()
        return max(pool, key=lambda sig: (self.book.posteriors[sig].builds[-1].hangs, -pool.index(sig)))

    def round_of_probes(self) -> list[Choice]:
        """The next round's probes (one unless `parallel`): each picked on a copy of the posterior that
        believes the likelier outcome of those picked before it."""
        believed = copy.deepcopy(self.post) if self.s.parallel > 1 else self.post
        picks: list[Choice] = []
        while len(picks) < self.s.parallel:
            groups, mass = believed.group_probabilities()
            if picks and mass.max() >= self.aim:
                break  # the believed outcomes already stop: the rest would be spent on nothing
            mttf = planning_mttf(believed, groups, mass)
            pool_h, _ = believed.group_pools(groups)
            aimed = aim_at(groups, mass, believed.hangs(), self.s.tuning.aim_mass)
            choice = choose(
                groups, mass, believed.passes(groups), pool_h, mttf, self.s.startup_s, self.aim, self.s.gpus, aimed
            )
            if choice is None:
                break
            if choice.role == "refute" and not picks and self.s.parallel > 1:
                # the end game's one long pass, split over copies side by side: a pass of each is the
                # same evidence (exposure pools), a hang of any says the same; each copy adds a start-up
                copies = max(1, min(self.s.parallel, int(choice.soak_s // (2 * self.s.startup_s))))
                return [replace(choice, soak_s=choice.soak_s / copies)] * copies
            picks.append(choice)
            if len(picks) < self.s.parallel:
                # a bad build hangs within the soak only with probability 1 - e^(-L / MTTF)
                if choice.p_bad * -math.expm1(-choice.soak_s / mttf) >= 0.5:
                    believed.observe(choice.index, HANG, True, min(mttf, choice.soak_s), 0.0)
                else:
                    believed.observe(choice.index, PASSED, False, choice.soak_s, 0.0)
        return picks

    def result(self, status: str) -> BuildBisectResult:
        if self.signature is None and self.book.candidates():
            self.signature = self.headline()
        post = self.post
        out = BuildBisectResult(
            status,
            self.builds,
            self.s.confidence,
            self.signature,
            evidence=post.builds,
            probes=self.probes,
            gpu_hours=self.gpu_hours,
            gpu_hours_by_role=dict(self.by_role),
            rounds=self.rounds,
        )
        out.signatures = sorted(
            (self.answer(sig) for sig in self.book.posteriors),
            key=lambda a: (
                not a.target,
                a.crash,
                self.book.first_seen.index(a.signature) if a.signature in self.book.first_seen else -1,
            ),
        )
        if status in (NOT_REPRODUCED, BAD_UNTESTABLE):
            self._mttf(out, post, post.lowest_bad())
            bad = post.builds[-1]
            out.notes.append(
                f"the bad build {self.builds[-1]} "
                + (
                    "could not be installed or started"
                    if status == BAD_UNTESTABLE
                    else f"did not hang in {bad.exposure_s / 3600:.1f} h of load: "
                    f"MTTF > {mttf_lower_bound(bad.exposure_s, self.s.confidence) / 3600:.1f} h "
                    f"at {self.s.confidence:.0%}"
                )
            )
            return out
        groups, mass = post.group_probabilities()
        order = sorted(range(len(groups)), key=lambda k: -mass[k])
        top = order[0]
        out.range, out.posterior = groups[top], float(mass[top])
        out.alternatives = [(groups[k][0], groups[k][1], float(mass[k])) for k in order[1:4] if mass[k] > 1e-4]
        lo, hi = out.range
        rate_change = lo >= 1 and post.hangs()[:lo].sum() > 0
        if status == FOUND:
            if (lo, hi) == (0, 0):
                status = NOT_A_REGRESSION
                out.notes.append(f"the good build {self.builds[0]} hangs with {self.signature} too: not a regression")
            elif lo == hi:
                out.first_bad = lo
                status = RATE_CHANGE if rate_change else FOUND
            else:
                status = RANGE
                out.notes.append(
                    f"builds {', '.join(self.builds[i] for i in range(lo, hi) if post.builds[i].is_untestable)}"
                    f" could not be tested: the first bad build is one of {self.builds[lo]}..{self.builds[hi]}"
                )
                if lo == 0:
                    out.notes.append("the good build could not be tested: this may not be a regression")
        elif status == INCONCLUSIVE:
            out.notes.append(
                f"the budget ran out: likeliest first bad {self.builds[lo]}"
                + (f"..{self.builds[hi]}" if hi > lo else "")
                + f" at {out.posterior:.3f}"
            )
        out.status = status
        self._mttf(out, post, lo if rate_change else post.lowest_bad())
        if lo >= 1:
            good = post.builds[lo - 1]
            if rate_change:
                # hangs before the change point are a signature's: the blank posterior (none yet) sees no hang
                assert self.signature is not None
                answer = verdict(self.signature, post, self.aim, self.s.confidence)
                out.mttf_before_low_s = answer.mttf_before_low_s
            elif good.exposure_s > 0:
                out.good_mttf_bound_s = mttf_lower_bound(good.exposure_s, self.s.confidence)
        others = len(out.signatures) - 1
        if others > 0:
            out.notes.append(f"{others} other signature(s) hung too; each is answered on its own below")
        return out

    def _mttf(self, out: BuildBisectResult, post: ChangePointPosterior, low: int | None) -> None:
        """The MTTF pooled over the builds from `low` on (the builds known bad, or the rate change's after)."""
        if low is None:
            return
        hangs, exposure = float(post.hangs()[low:].sum()), float(post.exposure()[low:].sum())
        if hangs:
            est = mttf_estimate(int(hangs), exposure, self.s.confidence)
            out.mttf_s, out.mttf_low_s, out.mttf_high_s, out.target_hangs = (
                est.point_s,
                est.low_s,
                est.high_s,
                int(hangs),
            )


def bisect_builds(
    builds: Sequence[str], oracle: BuildOracle, settings: BuildSettings | None = None
) -> BuildBisectResult:
    """Find the first bad build of `builds` (oldest first: index 0 is the good side, the last the
    bad build); see the module docstring."""
    run = _Run(builds, oracle, settings or BuildSettings())
    status = run.calibrate()
    if status is None:
        status = run.search()
    return run.result(status)
