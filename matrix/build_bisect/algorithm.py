"""Build bisection: the first bad build among an ordered list, with a stated confidence.

`bisect_builds(builds, oracle, settings)` is pure: the world is reached only through the injected
oracle (`oracle.BuildOracle`). It

1. **calibrates** on the bad build (the last): soaks it, each probe to its first hang, until
   `calibration_hangs` hangs of the target signature (the first hang's, never a crash's, unless
   `signature` names it); none within `calibration_max_s` of load is `not_reproduced`;
2. keeps a **posterior over the change point** (`posterior.ChangePointPosterior`: exposure pooled
   per build, one rate for every bad build, integrated out; only the target signature counts, other
   signatures end a probe and are counted apart; untestable builds merge with the next testable
   one into a group);
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
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from soakmatrix.matrix.contracts.stats import mttf_estimate, mttf_lower_bound

from .oracle import HANG, PASSED, UNTESTABLE, BuildOracle, BuildProbe, BuildProbeResult
from .planner import Choice, choose
from .posterior import BuildEvidence, ChangePointPosterior

FOUND = "found"
RANGE = "range"
NOT_A_REGRESSION = "not_a_regression"
NOT_REPRODUCED = "not_reproduced"
INCONCLUSIVE = "inconclusive"
BAD_UNTESTABLE = "bad_build_untestable"


@dataclass(frozen=True)
class BuildSettings:
    confidence: float = 0.99
    startup_s: float = 600.0             # expected install + start-up per probe (planning only)
    gpus: int = 1                        # GPUs per probe (planning only; the oracle reports the cost)
    calibration_hangs: int = 2
    calibration_max_s: float = 24 * 3600.0
    not_regression_prior: float = 0.05   # prior that the good build hangs too
    signature: str | None = None         # the target signature; None: the calibration's first hang's
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
    parallel: int = 1                    # probes soaked at once per round

    def __post_init__(self):
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if not 0.0 < self.error_share <= 1.0:
            raise ValueError(f"error_share must be in (0, 1], got {self.error_share}")
        if self.calibration_hangs < 1:
            raise ValueError("calibration needs at least one hang")


@dataclass
class BuildBisectResult:
    status: str
    builds: list[str]
    confidence: float
    signature: str | None
    first_bad: int | None = None         # index of the first bad build (found)
    range: tuple[int, int] | None = None  # (first, last) index of the likeliest group
    posterior: float = 0.0               # of that group
    alternatives: list[tuple[int, int, float]] = field(default_factory=list)   # next likeliest groups
    mttf_s: float = math.nan             # pooled over the builds known bad
    mttf_low_s: float = math.nan
    mttf_high_s: float = math.nan
    target_hangs: int = 0
    good_mttf_bound_s: float | None = None   # last good build: MTTF above this at `confidence`
    evidence: list[BuildEvidence] = field(default_factory=list)
    probes: int = 0
    gpu_hours: float = 0.0
    gpu_hours_by_role: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rounds: int = 0                      # batches of probes soaked at once (wall time, in soaks)

    @property
    def first_bad_build(self) -> str | None:
        return None if self.first_bad is None else self.builds[self.first_bad]

    @property
    def last_good(self) -> int | None:
        if self.range is None or self.range[0] == 0:
            return None
        return self.range[0] - 1

    @property
    def untestable(self) -> list[int]:
        return [i for i, b in enumerate(self.evidence) if b.is_untestable]


class _Run:
    """One bisection's state: the posterior, the spend, the target signature."""

    def __init__(self, builds: Sequence[str], oracle: BuildOracle, settings: BuildSettings):
        self.builds = list(builds)
        self.oracle = oracle
        self.s = settings
        self.post = ChangePointPosterior(len(builds), settings.not_regression_prior)
        for index, (hangs, exposure) in settings.known.items():
            b = self.post.builds[index]
            b.hangs += int(hangs)
            b.exposure_s += float(exposure)
        self.signature = settings.signature
        self.probes = 0
        self.rounds = 0
        self.gpu_hours = 0.0
        self.by_role: dict[str, float] = {}

    @property
    def aim(self) -> float:
        return 1.0 - self.s.error_share * (1.0 - self.s.confidence)

    def out_of_budget(self) -> bool:
        if self.probes >= self.s.max_probes:
            return True
        return self.s.budget_gpu_hours is not None and self.gpu_hours >= self.s.budget_gpu_hours

    def probe_batch(self, picks: Sequence[tuple[int, float, str]]) -> list[BuildProbeResult]:
        """Soak (build index, soak seconds, role) probes at once; every answer enters the posterior."""
        results = self.oracle.run([BuildProbe(i, self.builds[i], soak_s) for i, soak_s, _ in picks])
        self.rounds += 1
        for (index, _, role), result in zip(picks, results):
            # unnamed, the target is the first hang's signature, never a crash's (as in the flag
            # bisection): a frequent unrelated crash would otherwise be what gets bisected
            if self.signature is None and result.outcome == HANG and not result.crashed:
                self.signature = result.signature
            target = result.outcome == HANG and result.signature == self.signature
            self.post.observe(index, result.outcome, target, result.exposure_s, result.gpu_hours)
            self.probes += 1
            self.gpu_hours += result.gpu_hours
            self.by_role[role] = self.by_role.get(role, 0.0) + result.gpu_hours
        return results

    def probe(self, index: int, soak_s: float, role: str) -> BuildProbeResult:
        return self.probe_batch([(index, soak_s, role)])[0]

    def calibrate(self) -> str | None:
        """Soak the bad build to `calibration_hangs` target hangs; a status when that fails."""
        last = len(self.builds) - 1
        bad = self.post.builds[last]
        while bad.hangs < self.s.calibration_hangs:
            if self.out_of_budget():
                return INCONCLUSIVE
            left = self.s.calibration_max_s - bad.exposure_s
            if left <= 0:
                return NOT_REPRODUCED
            copies = min(self.s.parallel, self.s.calibration_hangs - bad.hangs)
            # side by side, each copy may soak what is left: the whole round stays within twice the cap
            results = self.probe_batch([(last, left, "calibration")] * copies)
            if all(r.outcome == UNTESTABLE for r in results):
                return BAD_UNTESTABLE
        return None

    def search(self) -> str:
        while True:
            groups, mass = self.post.group_probabilities()
            if mass.max() >= self.aim:
                return FOUND
            if self.out_of_budget():
                return INCONCLUSIVE
            picks = self.round_of_probes()
            if not picks:
                return INCONCLUSIVE
            self.probe_batch([(c.index, c.soak_s, "search") for c in picks])

    def round_of_probes(self) -> list[Choice]:
        """The next round's probes (one unless `parallel`): each picked on a copy of the posterior that
        believes the likelier outcome of those picked before it."""
        believed = copy.deepcopy(self.post) if self.s.parallel > 1 else self.post
        picks: list[Choice] = []
        while len(picks) < self.s.parallel:
            groups, mass = believed.group_probabilities()
            if picks and mass.max() >= self.aim:
                break           # the believed outcomes already stop: the rest would be spent on nothing
            hangs, exposure = believed.known_bad_pool()
            pool_h, pool_e = believed.group_pools(groups)
            mttf = exposure / hangs if hangs else math.nan
            choice = choose(groups, mass, pool_h, pool_e, mttf, self.s.startup_s, self.aim, self.s.gpus)
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
        out = BuildBisectResult(status, self.builds, self.s.confidence, self.signature,
                                evidence=self.post.builds, probes=self.probes, gpu_hours=self.gpu_hours,
                                gpu_hours_by_role=dict(self.by_role), rounds=self.rounds)
        hangs, exposure = self.post.known_bad_pool()
        if hangs:
            est = mttf_estimate(int(hangs), exposure, self.s.confidence)
            out.mttf_s, out.mttf_low_s, out.mttf_high_s, out.target_hangs = est.point_s, est.low_s, est.high_s, int(hangs)
        if status in (NOT_REPRODUCED, BAD_UNTESTABLE):
            bad = self.post.builds[-1]
            out.notes.append(f"the bad build {self.builds[-1]} " + (
                "could not be installed or started" if status == BAD_UNTESTABLE else
                f"did not hang in {bad.exposure_s / 3600:.1f} h of load: "
                f"MTTF > {mttf_lower_bound(bad.exposure_s, self.s.confidence) / 3600:.1f} h "
                f"at {self.s.confidence:.0%}"))
            return out
        groups, mass = self.post.group_probabilities()
        order = sorted(range(len(groups)), key=lambda k: -mass[k])
        top = order[0]
        out.range, out.posterior = groups[top], float(mass[top])
        out.alternatives = [(groups[k][0], groups[k][1], float(mass[k])) for k in order[1:4] if mass[k] > 1e-4]
        lo, hi = out.range
        if status == FOUND:
            if (lo, hi) == (0, 0):
                status = NOT_A_REGRESSION
                out.notes.append(f"the good build {self.builds[0]} hangs with {self.signature} too: not a regression")
            elif lo == hi:
                out.first_bad = lo
            else:
                status = RANGE
                out.notes.append(f"builds {', '.join(self.builds[i] for i in range(lo, hi) if self.post.builds[i].is_untestable)}"
                                 f" could not be tested: the first bad build is one of {self.builds[lo]}..{self.builds[hi]}")
                if lo == 0:
                    out.notes.append("the good build could not be tested: this may not be a regression")
        elif status == INCONCLUSIVE:
            out.notes.append(f"the budget ran out: likeliest first bad {self.builds[lo]}"
                             + (f"..{self.builds[hi]}" if hi > lo else "") + f" at {out.posterior:.3f}")
        out.status = status
        if lo >= 1:
            good = self.post.builds[lo - 1]
            if good.exposure_s > 0:
                out.good_mttf_bound_s = mttf_lower_bound(good.exposure_s, self.s.confidence)
        others = sum(b.other_hangs for b in self.post.builds)
        if others:
            out.notes.append(f"{others} hang(s) of other signatures ended probes early; they do not count")
        return out


def bisect_builds(builds: Sequence[str], oracle: BuildOracle, settings: BuildSettings | None = None) -> BuildBisectResult:
    """Find the first bad build of `builds` (oldest first: index 0 is the good side, the last the
    bad build); see the module docstring."""
    run = _Run(builds, oracle, settings or BuildSettings())
    status = run.calibrate()
    if status is None:
        status = run.search()
    return run.result(status)
