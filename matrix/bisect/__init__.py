"""Flag bisection for intermittent hangs: the smallest set of flags that still hangs, with confidence.

Pure: the probe oracle (matrix/bisect/oracle.py) is passed in; no clocks, processes or Ray here.

Model. Elements are the flags whose value in the failing cell differs from the matrix baseline; a
config is baseline + a subset of them (a bitmask). A hypothesis is a set K of elements: configs
containing K hang with the failing cell's signature at one shared rate lambda >= 1/cap ("fast"),
the others are "slow": rate 0 with prior weight `slow_zero_prior`, else uniform on (0, 1/cap).
Hangs of another signature only end a probe early. With a 1/lambda prior the likelihood of every
hypothesis has a closed form in (hangs, exposure) pooled over its fast configs, so every probe of
every config informs every hypothesis, and an unknown lambda needs no plug-in estimate.

Search, first by ablation. Calibrate the failing cell (several hangs: the MTTF gets an interval and,
by default, the cap, which then follows the pooled MTTF). Soak the failing cell without each flag in
turn: a hang drops the flag (the rest still holds the trigger, and the hang pools into the rate);
a removal that does not hang keeps it. Baseline + the kept flags must hang (certification); each
kept flag's absence is screened at a loose level; the rate check (below) runs on that set; then
each kept flag's absence is soaked until it rejects "as fast as the configs with the set" at
alpha / (3 n), on its own evidence. That is the shape of the lower bound (matrix/bisect/bound.py):
the evidence against "one flag fewer is enough" is the cost any procedure pays, and ablation spends
little else. When ablation cannot decide (every removal hangs, or the kept set never hangs: two
triggers), the posterior search goes on from every probe so far: it picks the config whose outcome
tells most per expected GPU-hour and soaks it until its first hang or until "it is fast" has dropped
to alpha / (expected remaining probes), and stops when the likeliest set has posterior >=
confidence, every config it says is slow was soaked in full, each of its flags passes the necessity
check at alpha / n, and the set itself was seen to hang.

The rate check lets the rate drop by a factor without one flag outside the set (_ModifierModel) and
soaks the configs that tell until it is sure whether the hang without that flag is slower than the
cap (the flag then joins the set, and each flag the search had put there is asked again with it
on). "The set is enough" also needs a prior-free Bayes factor of 2 / alpha against the mildest
slowdown that would make a flag needed. With an explicit cap, each flag of the set is also soaked
out to the cap. Then shrink multi-valued flags toward baseline.

A second, independent trigger (an OR of conjunctions) shows as hangs in configs without the
answer: the search still converges on one minimal set and the result says others may exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy import special
from scipy.stats import nbinom

from soakmatrix.matrix.contracts import stats
from soakmatrix.matrix.contracts.durations import format_duration

from .oracle import Probe, ProbeOracle, ProbeResult

SMALL_SET = 3              # sets of 1..SMALL_SET flags are equally likely a priori
LARGE_SET_FACTOR = 0.1     # each flag beyond that divides a set's prior by 10
BASELINE_PRIOR = 0.02      # prior weight of "the baseline itself hangs", relative to one small set
MIN_SOAK_MTTFS = 0.5       # a probe soaks at least this many MTTFs (and at least its start-up)
CAP_BOUND_CONFIDENCE = 0.99
POINT_CAP_FACTOR = 3.0     # the default cap settles at this many times the pooled MTTF
STAGE_HANGS = 6           # until this many hangs are pooled, a search probe soaks at most STAGE_MTTFS
STAGE_MTTFS = 5.0
NECESSITY_SOAKS = 3        # at most this many extra soaks per flag for the necessity check
CAP_RISE = 4.0             # a default cap may follow the pooled MTTF up to this many times the calibration's
ABLATION_STAGE_MTTFS = 5.0  # an ablation soak: at most this many MTTFs read from every probe so far
SCREEN_LEVEL = 0.02        # a kept flag's absence is screened at this level before the rate check
NECESSITY_SPLIT = 3.0      # ablation keeps a flag once its absence rejects "as fast" at alpha / (this x n)
CERTIFICATION_SOAKS = 2    # soaks of baseline + the kept flags before asking the rate check why it does not hang
RESCUE_PROBES = 12         # the rate check's probes for a kept set that does not hang (else: two triggers)
MAX_ELEMENTS = 16          # hypotheses are every subset: 2^16 of them is still milliseconds


@dataclass(frozen=True)
class Element:
    """A flag whose failing-cell value differs from the baseline."""

    name: str
    value: Any        # in the failing cell
    baseline: Any


@dataclass(frozen=True)
class Settings:
    confidence: float = 0.95
    mttf_cap_s: float | None = None     # None: cap_factor x the pooled MTTF's 99% upper bound
    cap_factor: float = 2.0             # two calibration hangs in E start the cap at ~13 E
    startup_s: float = 600.0            # expected start-up per probe (for choosing probes)
    calibration_hangs: int = 2
    calibration_max_soak_s: float | None = None   # per calibration probe; None: 24 h (or 8 x cap)
    parallel: int = 1                   # probes per batch
    max_probes: int = 200
    budget_gpu_hours: float | None = None
    shrink_values: bool = True
    verify_cap: bool | None = None      # soak each element out to the cap; None: only with an explicit cap
    probe_correction: float = 1.0       # per-probe miss = alpha / (expected remaining probes)^this
    slow_zero_prior: float = 0.99       # how conclusive one hang is: odds ~ 2 cap / (M (1 - this))
    modifier_prior: float = 0.3         # P(one flag outside the set slows the hang x6 or more); 0: no rate check
    ablation: bool = True               # remove one flag at a time first; False: the posterior search only


@dataclass
class ConfigStats:
    """Everything seen on one config; exposure pools across its probes."""

    mask: int
    label: str
    flags: dict[str, Any]
    hangs: int = 0               # with the failing cell's signature
    other_hangs: int = 0         # other signatures (ended a probe early)
    exposure_s: float = 0.0
    probes: int = 0
    gpu_hours: float = 0.0
    errors: int = 0              # config_error / infra_error probes
    longest_s: float = 0.0       # the longest soak a probe of it asked for
    role: str = "search"         # calibration | search | certification | shrink

    def mttf(self, confidence: float) -> stats.MttfEstimate:
        return stats.mttf_estimate(self.hangs, self.exposure_s, confidence)


@dataclass(frozen=True)
class FlagVerdict:
    element: Element
    kind: str                    # necessary | modifier | irrelevant | context
    text: str                    # e.g. "modifier x8.1 (p=0.002)"
    ratio: float | None = None
    p_value: float | None = None


@dataclass(frozen=True)
class ValueProbe:
    flag: str
    value: Any
    hangs: int
    exposure_s: float
    verdict: str                 # "hangs" | "MTTF > X at c" | "infeasible: ..."


@dataclass
class BisectResult:
    status: str                          # found | not_reproduced | inconclusive
    signature: str | None
    elements: list[Element]
    context: dict[str, Any]
    minimal: list[str]                   # element names of the minimal set
    posterior: float                     # P(minimal set is the answer | data)
    confidence: float
    mttf_cap_s: float
    failing: stats.MttfEstimate | None
    minimal_mttf: stats.MttfEstimate | None
    certified_soak_s: float | None       # soak that sees the minimal set hang with prob = confidence
    verdicts: list[FlagVerdict]
    configs: list[ConfigStats]
    values: list[ValueProbe]
    probes: int
    gpu_hours: float
    notes: list[str] = field(default_factory=list)
    log: list[ProbeResult] = field(default_factory=list)
    minimal_flags: dict[str, Any] = field(default_factory=dict)
    gpu_hours_by_role: dict[str, float] = field(default_factory=dict)   # calibration, search, rate check, ...
    rate_added: list[str] = field(default_factory=list)   # flags of the minimal set the rate check put there


FeasibleFn = Callable[[Mapping[str, Any]], str | None]   # why a flag dict cannot run, or None
GpuCountFn = Callable[[Mapping[str, Any]], int]


def default_gpu_count(flags: Mapping[str, Any]) -> int:
    return int(flags.get("tp", 1) or 1)


def default_cap(hangs: int, exposure_s: float, factor: float = 2.0) -> float:
    """The MTTF cap derived from the failing cell (later: from the configs that share its rate).

    `factor` x the MTTF's 99% upper bound while few hangs are in (so a noisy calibration, two
    lucky early hangs, does not put the failing cell itself above the cap), tightening to
    POINT_CAP_FACTOR x the point estimate as hangs pool up, never below the upper bound. A cap that
    settles near a fixed multiple of the MTTF keeps a modifier's verdict (is the hang without it
    slower than the cap?) away from a coin toss on the cap's own noise."""
    upper = stats.mttf_upper_bound(hangs, exposure_s, CAP_BOUND_CONFIDENCE)
    if hangs <= 0:
        return factor * upper
    return max(upper, min(factor * upper, POINT_CAP_FACTOR * exposure_s / hangs))


# -- the posterior over hypotheses ------------------------------------------------------------------

class Posterior:
    """Log-posterior over every subset K of n elements, updated incrementally per observation."""

    def __init__(self, n: int, cap_s: float, slow_zero_prior: float):
        if n > MAX_ELEMENTS:
            raise ValueError(f"{n} elements differ from the baseline; bisection handles at most "
                             f"{MAX_ELEMENTS}: move more flags to the baseline or fix them in the cell")
        self.n = n
        self.cap = cap_s
        self.pi0 = slow_zero_prior
        self.K = np.arange(1 << n, dtype=np.int64)
        self.size = sum((self.K >> i) & 1 for i in range(n)) if n else np.zeros(1, dtype=np.int64)
        # prior: triggers are usually one to three flags: every set of 1-3 flags equally likely
        # (so a pair needs no more evidence than a single flag), larger sets x0.1 per extra flag,
        # the baseline itself (the empty set) unlikely
        sizes = self.size.astype(float)
        self.log_prior = np.where(sizes == 0, math.log(BASELINE_PRIOR),
                                  np.maximum(sizes - SMALL_SET, 0.0) * math.log(LARGE_SET_FACTOR))
        self.log_prior -= special.logsumexp(self.log_prior)
        self.H = np.zeros(1 << n)          # target hangs pooled over each K's fast configs
        self.E = np.zeros(1 << n)          # exposure pooled likewise
        self.slow_in_fast = np.zeros(1 << n)   # sum of log L_slow over configs that are fast for K
        self.slow_total = 0.0
        self.cells: dict[int, tuple[int, float]] = {}

    def subsets_of(self, mask: int) -> np.ndarray:
        return (self.K & ~mask) == 0

    def log_slow(self, hangs: int, exposure: float) -> float:
        if exposure <= 0:
            return 0.0 if hangs == 0 else -math.inf
        x = exposure / self.cap
        if hangs == 0:
            uniform = -math.expm1(-x) / x          # mean of exp(-mu E) over mu ~ U(0, 1/cap)
            return math.log(self.pi0 + (1 - self.pi0) * uniform)
        if self.pi0 >= 1.0:
            return -math.inf
        log_uniform = (math.log(self.cap) + special.gammaln(hangs + 1) + math.log(max(special.gammainc(hangs + 1, x), 1e-300))
                       - (hangs + 1) * math.log(exposure))
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


def _zeta(p: np.ndarray, n: int) -> np.ndarray:
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
    lo, hi = exposure, max(exposure, pool_exposure / max(pool_hangs, 1.0))
    while p_as_fast(hangs, hi, pool_hangs, pool_exposure) > level:
        lo, hi = hi, 2.0 * hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if p_as_fast(hangs, mid, pool_hangs, pool_exposure) > level else (lo, mid)
    return hi


def _h2(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


# -- the search ---------------------------------------------------------------------------------------

class _Search:
    def __init__(self, failing_flags: Mapping[str, Any], elements: Sequence[Element], oracle: ProbeOracle,
                 settings: Settings, signature: str | None, feasible: FeasibleFn | None,
                 gpu_count: GpuCountFn, progress: Callable[[str], None] | None):
        self.failing = dict(failing_flags)
        self.elements = list(elements)
        self.n = len(self.elements)
        self.full = (1 << self.n) - 1
        self.oracle = oracle
        self.s = settings
        self.signature = signature
        self.feasible = feasible
        self.gpu_count = gpu_count
        self.progress = progress or (lambda _msg: None)
        self.configs: dict[int, ConfigStats] = {}
        self.extra_configs: list[ConfigStats] = []
        self.log: list[ProbeResult] = []
        self.gpu_hours = 0.0
        self.probes = 0
        self.alpha = 1.0 - settings.confidence
        self.post: Posterior | None = None
        self._staged = False
        self.full_soaked: set[int] = set()     # configs soaked at least once without staging
        self.necessity_soaks: dict[int, int] = {}   # element -> soaks the necessity check asked for
        self.decided = False                        # the search reached an answer it can vouch for
        self.spent: dict[str, float] = {}           # GPU-hours by role (calibration, search, ...)
        self.notes: list[str] = []
        self.gave_up = ""                           # why the ablation handed over to the posterior search
        self.rate_added = 0                         # flags the rate check added: their absence hangs, slowly
        masks = range(1 << self.n)
        if gpu_count is default_gpu_count and not any(e.name == "tp" for e in self.elements):
            self._cost = np.full(1 << self.n, float(gpu_count(self.failing)))
        else:
            self._cost = np.array([gpu_count(self.flags_of(m)) for m in masks], dtype=float)
        self._ok = (np.ones(1 << self.n, dtype=bool) if feasible is None
                    else np.array([self._feasible_mask(m) for m in masks], dtype=bool))

    # -- configs ----------------------------------------------------------------------------------

    def flags_of(self, mask: int, **overrides: Any) -> dict[str, Any]:
        flags = dict(self.failing)
        for i, e in enumerate(self.elements):
            if not mask >> i & 1:
                flags[e.name] = e.baseline
        flags.update(overrides)
        return flags

    def label(self, mask: int) -> str:
        on = [e.name for i, e in enumerate(self.elements) if mask >> i & 1]
        if mask == self.full:
            return "failing cell"
        return "baseline" + "".join(f" +{name}" for name in on)

    def _feasible_mask(self, mask: int) -> bool:
        return self.feasible is None or self.feasible(self.flags_of(mask)) is None

    def stats_of(self, mask: int) -> ConfigStats:
        if mask not in self.configs:
            self.configs[mask] = ConfigStats(mask, self.label(mask), self.flags_of(mask))
        return self.configs[mask]

    def over_budget(self) -> bool:
        s = self.s
        return self.probes >= s.max_probes or (s.budget_gpu_hours is not None and self.gpu_hours >= s.budget_gpu_hours)

    # -- running probes ---------------------------------------------------------------------------

    def run(self, batch: list[tuple[int, float, str]]) -> list[tuple[int, ProbeResult]]:
        probes = [Probe(self.flags_of(mask), soak, self.label(mask)) for mask, soak, _ in batch]
        results = self.oracle.run(probes)
        out = []
        for (mask, soak, role), result in zip(batch, results):
            self.log.append(result)
            self.probes += 1
            self.gpu_hours += result.gpu_hours
            self.spent[role] = self.spent.get(role, 0.0) + result.gpu_hours
            cs = self.stats_of(mask)
            if cs.role == "search" and role != "search":
                cs.role = role
            cs.probes += 1
            cs.gpu_hours += result.gpu_hours
            cs.longest_s = max(cs.longest_s, soak)
            if result.outcome in ("config_error", "infra_error"):
                cs.errors += 1
                if result.outcome == "config_error":
                    self._ok[mask] = False
                out.append((mask, result))
                continue
            if result.hung and self.signature is None:
                self.signature = result.signature
            target = result.hung_with(self.signature)
            cs.exposure_s += result.exposure_s
            if target:
                cs.hangs += 1
            elif result.hung:
                cs.other_hangs += 1
            if self.post is not None:
                self.post.observe(mask, int(target), result.exposure_s)
            self.progress(f"probe {self.probes}: {cs.label}: "
                          f"{'HANG ' + str(result.signature) if result.hung else 'no hang'} after "
                          f"{result.exposure_s:.0f}s (cumulative {cs.hangs} hangs / {cs.exposure_s:.0f}s)")
            out.append((mask, result))
        return out

    # -- calibration ------------------------------------------------------------------------------

    def calibrate(self) -> tuple[bool, float]:
        s = self.s
        cs = self.stats_of(self.full)
        cs.role = "calibration"
        max_soak = s.calibration_max_soak_s
        if max_soak is None:
            max_soak = 8.0 * s.mttf_cap_s if s.mttf_cap_s else 24 * 3600.0
        misses = 0
        while cs.hangs < s.calibration_hangs and not self.over_budget():
            need = s.calibration_hangs - cs.hangs
            batch = [(self.full, max_soak, "calibration")] * max(1, min(s.parallel, need))
            results = self.run(batch)
            if not any(r.hung_with(self.signature) for _, r in results):
                misses += len(results)
                if cs.hangs == 0 and misses >= 1 and all(r.outcome == "passed" for _, r in results):
                    return False, max_soak
            if all(r.outcome in ("config_error",) for _, r in results):
                return False, max_soak
        return cs.hangs > 0, max_soak

    # -- choosing probes --------------------------------------------------------------------------

    def _rate_pool(self, lp: np.ndarray) -> tuple[float, float]:
        k = int(np.argmax(lp))
        return float(self.post.H[k]), float(self.post.E[k])

    def _soak_for(self, p_fast: np.ndarray, H: float, E: float, delta: float) -> np.ndarray:
        """Soak after which, without a hang, P(fast) falls to delta (lambda ~ Gamma(H, E))."""
        odds = np.clip(p_fast, 1e-12, 1 - 1e-12) / np.clip(1 - p_fast, 1e-12, None)
        factor = np.maximum(odds * (1 - delta) / delta, 1.0 + 1e-9)
        soak = E * (factor ** (1.0 / H) - 1.0)
        mttf = E / H
        # a hypothesis at the cap is the slowest that still counts: never soak longer than that needs
        longest = self.post.cap * np.log(1.0 / delta)     # soak_for_detection(cap, 1 - delta)
        # every probe pays its start-up: a soak much shorter than that buys little
        shortest = max(MIN_SOAK_MTTFS * mttf, self.s.startup_s)
        return np.clip(soak, shortest, np.maximum(longest, shortest))

    def choose(self, lp: np.ndarray, delta: float) -> tuple[int, float]:
        n = self.n
        p_fast = np.clip(_zeta(np.exp(lp), n), 0.0, 1.0)
        H, E = self._rate_pool(lp)
        mttf = E / H
        settling = self._soak_for(p_fast, H, E, delta)
        soak = settling
        if H < STAGE_HANGS:
            # lambda is still vague: refuting a config now would take a soak of many MTTFs that
            # positives (which pool more hangs) will soon shorten; soak a few MTTFs and come back
            soak = np.minimum(settling, max(STAGE_MTTFS * mttf, self.s.startup_s))
        detect = 1.0 - (E / (E + soak)) ** H
        p_hang = p_fast * detect
        info = _h2(p_hang) - p_fast * _h2(detect)
        expected_load = p_fast * mttf * detect + (1 - p_hang) * soak
        cost = self._cost * (self.s.startup_s + expected_load)
        score = np.where(self._ok, info / cost, -np.inf)
        best = int(np.argmax(score))
        # staged only if the clip shortened this soak: a pass of the soak that settles the
        # question needs no second, full soak before the stop
        self._staged = bool(soak[best] < settling[best])
        return best, float(soak[best])

    def _staged_passes(self, top: int) -> int | None:
        """A config that top says is slow, never hung, and was only ever soaked while the rate was
        vague (staged), or None."""
        for mask, cs in self.configs.items():
            if top & ~mask and cs.hangs == 0 and cs.exposure_s > 0 and mask not in self.full_soaked \
                    and self._ok[mask] and cs.role == "search":
                return mask
        return None

    def _unproven_necessity(self, top: int, lp: np.ndarray) -> tuple[int, float] | None:
        """A flag of `top` whose absence was not yet soaked long enough to reject, on its own and
        at alpha / n, "as fast as the configs with top": the config to soak and for how long.

        The posterior's stop leans on its prior, which favours larger sets (there are more of
        them), and each innocent flag probed is one more chance for an unlucky pass of a fast
        config; this test is the prior-free guard, Bonferroni over the n flags. Hangs without the
        flag in the wider configs may come from another trigger: then the narrowest config
        (baseline + top without the flag) must show the slowdown itself."""
        H, E = self._rate_pool(lp)
        level = self.alpha / max(self.n, 1)
        for j in range(self.n):
            bit = 1 << j
            if not top & bit or self.necessity_soaks.get(j, 0) >= NECESSITY_SOAKS:
                continue
            rest = top & ~bit
            rows = [cs for m, cs in self.configs.items() if (m & rest) == rest and not m & bit]
            h, e = sum(cs.hangs for cs in rows), sum(cs.exposure_s for cs in rows)
            if p_as_fast(h, e, H, E) <= level:
                continue
            target = self.full & ~bit
            if h > 0:
                narrow = self.configs.get(rest)
                h, e = (narrow.hangs, narrow.exposure_s) if narrow else (0, 0.0)
                if p_as_fast(h, e, H, E) <= level:
                    continue
                target = rest
            if not self._ok[target]:
                continue
            self.necessity_soaks[j] = self.necessity_soaks.get(j, 0) + 1
            return target, max(exposure_until(h, e, H, E, level) - e, self.s.startup_s)
        return None

    def cap_from(self, hangs: float, exposure: float) -> float:
        """The default cap from a pool of configs that share the failing cell's rate."""
        return min(CAP_RISE * self.initial_cap, default_cap(int(hangs), exposure, self.s.cap_factor))

    def _follow_cap(self, lp: np.ndarray) -> np.ndarray:
        """A default cap tracks the MTTF pooled over the likeliest set's configs (more hangs than
        the calibration alone, so a tighter bound). It may rise to CAP_RISE x the calibration's:
        two lucky early calibration hangs would otherwise hold the cap far below the real MTTF
        and make every later hang look slow."""
        return self.post.log_posterior() if self._track_cap(*self._rate_pool(lp)) else lp

    def search(self) -> int:
        """The answer's mask: the ablation's, or (when the ablation cannot decide) the posterior
        search's likeliest set."""
        if self.s.ablation:
            answer = self.ablation_search()
            if answer is not None:
                self.decided = True
                return answer
            if not self.over_budget():
                self.notes.append(f"removing one flag at a time could not decide ({self.gave_up}): "
                                  "searched every set of flags instead, with every probe so far")
                self.progress(self.notes[-1])
        self.posterior_search()
        lp = self.post.log_posterior()
        top = int(np.argmax(lp))
        self.decided = math.exp(lp[top]) >= self.s.confidence
        return top

    # -- ablation ---------------------------------------------------------------------------------

    def _pool(self, keep: int) -> tuple[float, float]:
        """Hangs and exposure pooled over every config that contains `keep`."""
        rows = [cs for m, cs in self.configs.items() if (m & keep) == keep]
        return float(sum(cs.hangs for cs in rows)), float(sum(cs.exposure_s for cs in rows))

    def _lacking(self, keep: int, bit: int) -> tuple[int, float]:
        """Hangs and exposure pooled over every config that contains `keep` but for `bit`."""
        rest = keep & ~bit
        rows = [cs for m, cs in self.configs.items() if (m & rest) == rest and not m & bit]
        return sum(cs.hangs for cs in rows), sum(cs.exposure_s for cs in rows)

    def _track_cap(self, H: float, E: float) -> bool:
        """Move a default cap to the one H hangs in E give, when that differs by over 10 %.
        Returns whether it moved."""
        if self.s.mttf_cap_s is not None or H <= 0:
            return False
        cap = self.cap_from(H, E)
        if abs(cap - self.post.cap) <= 0.1 * self.post.cap:
            return False
        self.post.set_cap(cap)
        return True

    def ablation_search(self) -> int | None:
        """Soak the failing cell without each flag in turn: a hang drops the flag (what is left
        still holds the trigger), a removal that does not hang keeps it. Then baseline + the kept
        flags must hang (certification); every kept flag's absence is screened at a loose level
        (an innocent flag kept by an unlucky first soak hangs here); the rate check looks for a
        flag outside the set that the rate needs; and each kept flag's absence is soaked until it
        rejects "as fast as the configs with the set" at alpha / (3 n) (NECESSITY_SPLIT).

        Returns the kept set, or None when ablation cannot decide (a removal that cannot run,
        every removal hanging, a kept set that does not hang and the rate check cannot say why:
        two triggers), for the posterior search to go on from, with every probe's data."""
        s = self.s
        keep = self._ablate_each()
        if keep is None:
            return None
        level = self.alpha / max(self.n, 1) / NECESSITY_SPLIT
        guarded = s.modifier_prior <= 0      # the rate check runs once, between screen and necessity
        rescued: set[int] = set()
        while not self.over_budget():
            H, E = self._pool(keep)
            self._track_cap(H, E)
            narrow = self.stats_of(keep)
            if narrow.hangs == 0:
                if keep == 0:
                    return self._give_up("every flag's removal still hung: two triggers, or the baseline hangs")
                if not self._ok[keep]:
                    return self._give_up("baseline + the kept flags cannot run")
                if narrow.probes < CERTIFICATION_SOAKS:
                    self._certify(keep, H, E)
                    continue
                # baseline + the set is slower than the configs with more flags: one of those is
                # needed for the rate (a modifier the cap makes part of the set) or holds a second
                # trigger; the rate check gets a few probes to find the first
                if keep in rescued:
                    return self._give_up("baseline + the kept flags does not hang")
                rescued.add(keep)
                notes: list[str] = []
                grown, rate_cap = _rate_check(self, keep, s.mttf_cap_s, notes, RESCUE_PROBES)
                if grown == keep or rate_cap is None:
                    return self._give_up("baseline + the kept flags does not hang, and no one flag more makes it")
                self.notes += notes
                self.rate_added |= grown & ~keep
                keep = grown
                continue
            goal = level if guarded else SCREEN_LEVEL
            dropped, todo = self._unrefuted(keep & ~self.rate_added, keep, H, E, goal)
            if dropped:
                keep &= ~dropped
                continue
            if not todo and not guarded:
                guarded = True
                grown, _ = _rate_check(self, keep, s.mttf_cap_s, self.notes)
                self.rate_added |= grown & ~keep
                keep = grown
                continue
            if not todo:
                return keep
            # with fewer flags to soak than --parallel, each flag's exposure is split over copies
            width = max(1, s.parallel)
            todo = todo[:width]
            batch = []
            for i, (j, need) in enumerate(todo):
                n_copies = len(range(i, width, len(todo)))       # the width dealt out round-robin
                target = self.full & ~(1 << j)
                if not self._ok[target]:
                    target = keep & ~(1 << j)
                if not self._ok[target]:
                    return self._give_up(f"no config without {self.elements[j].name} can run")
                soak = max(min(need / n_copies, self._stage(target)), s.startup_s)
                batch += [(target, soak, "search")] * n_copies
            self.run(batch)
        return None

    def _give_up(self, why: str) -> None:
        self.gave_up = why
        return None

    def _ablate_each(self) -> int | None:
        """The first round: the failing cell without each flag, one soak each (ABLATION_STAGE_MTTFS x
        the MTTF read so far, never longer than a config at the cap needs to show itself).
        Returns the flags whose removal did not hang, or None if a removal cannot run."""
        s = self.s
        keep = self.full
        longest = stats.soak_for_detection(self.post.cap, 1 - self.alpha / max(self.n, 1))
        untested = list(range(self.n))
        while untested and not self.over_budget():
            soak = max(min(self._stage(), longest), s.startup_s)
            batch = []
            for j in untested[:max(1, s.parallel)]:
                target = self.full & ~(1 << j)
                if not self._ok[target]:
                    return self._give_up(f"the failing cell without {self.elements[j].name} cannot run")
                batch.append((target, soak, "search"))
            del untested[:len(batch)]
            for mask, result in self.run(batch):
                if result.hung_with(self.signature):
                    keep &= mask
        return keep

    def _certify(self, keep: int, H: float, E: float) -> None:
        """Soak baseline + the kept flags long enough to see it hang if it is as fast as the
        configs with more flags (the slower of the pooled MTTF and the one read from every probe)."""
        mttf = max(E / max(H, 1.0), self._stage() / ABLATION_STAGE_MTTFS)
        soak = min(stats.soak_for_detection(mttf, 1 - self.alpha / 2),
                   stats.soak_for_detection(self.post.cap, 1 - self.alpha / 2))
        soak = max(soak, 2.0 * self.stats_of(keep).longest_s)
        self.stats_of(keep).role = "certification"
        self.run([(keep, max(soak, self.s.startup_s), "certification")])

    def _unrefuted(self, flags: int, keep: int, H: float, E: float, goal: float) -> tuple[int, list[tuple[int, float]]]:
        """Of `flags` (all in `keep`): those whose absence was seen to hang (to drop), and the
        others whose absence has not yet rejected "as fast as the configs with `keep`" at `goal`,
        with the exposure still needed, fewest first."""
        dropped, todo = 0, []
        for j in range(self.n):
            bit = 1 << j
            if not flags & bit:
                continue
            h, e = self._lacking(keep, bit)
            if h > 0:
                dropped |= bit
            elif p_as_fast(0, e, H, E) > goal:
                todo.append((j, exposure_until(0, e, H, E, goal) - e))
        return dropped, sorted(todo, key=lambda t: t[1])

    def _stage(self, mask: int | None = None) -> float:
        """The longest soak the ablation gives one config at a time: ABLATION_STAGE_MTTFS x an MTTF
        that neither lucky early hangs nor the kept flags' passes can pull far off, and at least
        twice `mask`'s longest soak so far: a hang that needs a long unbroken run under load (seed
        000 came hours into a chat) is never seen by soaks that stay short, however many.

        The MTTF is the rate's maximum likelihood over every hang so far, each hang's time read as
        truncated at its probe's soak (a probe stopped at its soak could only have hung within it:
        read plainly, short soaks make the rate look fast, and short soaks come from a fast-looking
        rate). Passes do not count, since a kept flag's removal never hangs; the MTTF read from
        every probe, passes included, bounds it from above. An innocent flag's removal then rarely
        passes a stage; such a pass would keep the flag, and its exposure out of the pooled rate."""
        again = 2.0 * self.configs[mask].longest_s if mask in self.configs else 0.0
        hangs = [(r.exposure_s, r.probe.soak_s) for r in self.log if r.hung_with(self.signature)]
        everything = sum(cs.exposure_s for cs in self.configs.values())
        slowest = everything / max(len(hangs), 1)
        if not hangs:
            return max(ABLATION_STAGE_MTTFS * slowest, again)
        t = np.array([h[0] for h in hangs])
        soak = np.array([max(h[1], h[0]) for h in hangs])
        rate = len(hangs) / max(float(t.sum()), 1e-9)
        for _ in range(50):
            # d/d rate of sum(ln rate - rate t - ln(1 - exp(-rate soak))) = 0, as a fixed point
            correction = soak / np.expm1(np.minimum(rate * soak, 700.0))
            new_rate = len(hangs) / float((t + correction).sum())
            if abs(new_rate - rate) <= 1e-9 * rate:
                break
            rate = new_rate
        return max(ABLATION_STAGE_MTTFS * min(1.0 / max(rate, 1e-12), slowest), again)

    def posterior_search(self) -> None:
        s = self.s
        while not self.over_budget():
            lp = self.post.log_posterior()
            if self.s.mttf_cap_s is None:
                lp = self._follow_cap(lp)
            top = int(np.argmax(lp))
            p_top = math.exp(lp[top])
            if p_top >= s.confidence:
                doubtful = self._staged_passes(top)
                if doubtful is not None:
                    # the answer leans on a config that only ever passed a staged soak, read on a
                    # rate from a handful of hangs: soak it in full before believing it is slow
                    H, E = self._rate_pool(lp)
                    p_c = np.array([float(np.exp(lp)[self.post.subsets_of(doubtful)].sum())])
                    soak = float(self._soak_for(np.maximum(p_c, 0.5), H, E, self.alpha / 2)[0])
                    self.full_soaked.add(doubtful)
                    self.run([(doubtful, soak, "search")])
                    continue
                unproven = self._unproven_necessity(top, lp)
                if unproven is not None:
                    self.full_soaked.add(unproven[0])
                    self.run([(unproven[0], unproven[1], "search")])
                    continue
                if self.stats_of(top).hangs > 0:
                    return
                # certification: the answer itself must be seen to hang
                H, E = self._rate_pool(lp)
                soak = stats.soak_for_detection(E / H, 1 - self.alpha / 2)
                soak = min(soak, stats.soak_for_detection(self.post.cap, 1 - self.alpha / 2))
                if not self._ok[top]:
                    return
                self.stats_of(top).role = "certification"
                self.run([(top, soak, "certification")])
                continue
            remaining = max(1.0, float(-(np.exp(lp) * lp / math.log(2)).sum()))
            delta = self.alpha / (remaining + 1.0) ** self.s.probe_correction
            batch = []
            hallucinated: list[tuple[int, int, float]] = []
            for _ in range(max(1, s.parallel)):
                mask, soak = self.choose(lp, delta)
                if not self._staged:
                    self.full_soaked.add(mask)
                batch.append((mask, soak, "search"))
                if len(batch) < s.parallel:
                    # imagine the likelier outcome so the next pick in the batch asks something new
                    p_fast = float(np.exp(lp)[self.post.subsets_of(mask)].sum())
                    H, E = self._rate_pool(lp)
                    hang = p_fast > 0.5
                    hallucinated.append((mask, int(hang), E / H if hang else soak))
                    self.post.observe(mask, int(hang), E / H if hang else soak)
                    lp = self.post.log_posterior()
            for mask, h, e in hallucinated:
                self.post.observe(mask, -h, -e)
            self.run(batch)


# -- value shrinking and verdicts -------------------------------------------------------------------

def _shrink_values(search: _Search, minimal_mask: int, alternatives: Mapping[str, Sequence[Any]],
                   soak_s: float) -> list[ValueProbe]:
    out: list[ValueProbe] = []
    for i, e in enumerate(search.elements):
        if not minimal_mask >> i & 1:
            continue
        for value in alternatives.get(e.name, ()):
            if search.over_budget():
                return out
            flags = search.flags_of(minimal_mask, **{e.name: value})
            reason = search.feasible(flags) if search.feasible else None
            if reason:
                out.append(ValueProbe(e.name, value, 0, 0.0, f"infeasible: {reason}"))
                continue
            result = search.oracle.run([Probe(flags, soak_s, f"{search.label(minimal_mask)} with {e.name}={value}")])[0]
            search.log.append(result)
            search.probes += 1
            search.gpu_hours += result.gpu_hours
            search.spent["shrink"] = search.spent.get("shrink", 0.0) + result.gpu_hours
            cs = ConfigStats(-1, f"minimal set with {e.name}={value}", flags, role="shrink",
                             probes=1, gpu_hours=result.gpu_hours)
            search.extra_configs.append(cs)
            if result.outcome in ("config_error", "infra_error"):
                out.append(ValueProbe(e.name, value, 0, 0.0, f"{result.outcome}: {result.message}"))
                continue
            cs.exposure_s = result.exposure_s
            hung = result.hung_with(search.signature)
            cs.hangs = int(hung)
            cs.other_hangs = int(result.hung and not hung)
            if hung:
                out.append(ValueProbe(e.name, value, 1, result.exposure_s, "hangs"))
            else:
                bound = stats.mttf_lower_bound(result.exposure_s, search.s.confidence)
                out.append(ValueProbe(e.name, value, 0, result.exposure_s,
                                      f"no hang in {format_duration(result.exposure_s)}: MTTF > {format_duration(bound)} "
                                      f"at {search.s.confidence:.0%}"))
                if isinstance(value, int) and not isinstance(value, bool):
                    break   # a smaller TP/MTP is not tried once a larger one stopped hanging
    return out


def _verdicts(search: _Search, minimal_mask: int, context: Mapping[str, Any],
              context_elements: Sequence[Element]) -> list[FlagVerdict]:
    out: list[FlagVerdict] = []
    conf = search.s.confidence
    for i, e in enumerate(search.elements):
        bit = 1 << i
        if minimal_mask & bit:
            without = [cs for m, cs in search.configs.items() if (m & minimal_mask) == (minimal_mask & ~bit)]
            h = sum(cs.hangs for cs in without)
            exp = sum(cs.exposure_s for cs in without)
            if h:
                text = (f"necessary (without it: {h} hang(s) in {format_duration(exp)}, MTTF ~{format_duration(exp / h)}, "
                        f"slower than the cap)")
            else:
                text = f"necessary (without it: MTTF > {format_duration(stats.mttf_lower_bound(exp, conf))} at {conf:.0%})"
            out.append(FlagVerdict(e, "necessary", text))
            continue
        with_e = [cs for m, cs in search.configs.items() if (m & minimal_mask) == minimal_mask and m & bit]
        without_e = [cs for m, cs in search.configs.items() if (m & minimal_mask) == minimal_mask and not m & bit]
        ha, ea = sum(c.hangs for c in with_e), sum(c.exposure_s for c in with_e)
        hb, eb = sum(c.hangs for c in without_e), sum(c.exposure_s for c in without_e)
        cmp = stats.compare_rates(ha, ea, hb, eb)
        if ea > 0 and eb > 0 and cmp.p_value < 1 - conf and (ha + hb) > 0:
            ratio = cmp.ratio
            shown = "inf" if math.isinf(ratio) else f"{ratio:.1f}"
            out.append(FlagVerdict(e, "modifier", f"modifier x{shown} (p={cmp.p_value:.2g})", ratio, cmp.p_value))
        else:
            p = f"p={cmp.p_value:.2g}" if ea > 0 and eb > 0 else "not compared"
            out.append(FlagVerdict(e, "irrelevant", f"irrelevant ({p})", cmp.ratio, cmp.p_value))
    for e in context_elements:
        out.append(FlagVerdict(e, "context", f"context (fixed at {e.value!r}: {context.get(e.name, '')})"))
    return out


def _without(search: _Search, mask: int, bit: int) -> tuple[int, float]:
    """Hangs and exposure of baseline + the set but for one element (that exact config: configs
    with more flags may hang through another trigger)."""
    cs = search.configs.get(mask & ~bit)
    return (cs.hangs, cs.exposure_s) if cs else (0, 0.0)


def _drop_modifiers(search: _Search, mask: int, cap: float, notes: list[str]) -> int:
    """An element whose removal still hangs within the cap only changes how often: drop it.

    Hangs seen without it count; with an explicit cap (`verify_cap`), each element is also soaked
    out until "MTTF > cap at the stated confidence" holds or it hangs.
    """
    s = search.s
    changed = True
    while changed and not search.over_budget():
        changed = False
        for i, e in enumerate(search.elements):
            bit = 1 << i
            if not mask & bit:
                continue
            h, exposure = _without(search, mask, bit)
            need = stats.soak_for_detection(cap, s.confidence) - exposure
            if h == 0 and s.verify_cap and need > 0 and search._ok[mask & ~bit]:
                search.stats_of(mask & ~bit).role = "cap check"
                search.run([(mask & ~bit, need, "cap check")])
                h, exposure = _without(search, mask, bit)
            if s.verify_cap and h > 0 and exposure / h <= cap:
                notes.append(f"{e.name} is not needed for the hang within the cap: without it "
                             f"{h} hang(s) in {format_duration(exposure)} (MTTF ~{format_duration(exposure / h)} "
                             f"<= cap {format_duration(cap)})")
                mask &= ~bit
                changed = True
                break
    return mask


# How much slower the hang may be without one flag outside the set: log-uniform from twice the
# default cap's factor up (a factor nearer the cap's would be a coin toss on the cap's own noise).
MODIFIER_FACTORS = tuple(2.0 * POINT_CAP_FACTOR * 2.0 ** i for i in range(4))   # x6, x12, x24, x48
ENOUGH_FACTOR = 2.0                  # the rate check's guard counts up to x2 slower as "the set is enough"
MODIFIER_SOAKS = (1.0, 2.0, 4.0)     # candidate soaks of a rate-check probe, in pooled MTTFs
MAX_MODIFIER_PROBES = 100
MODIFIER_EVIDENCE_HANGS = 3          # the set alone hangs at least this often: every modifier verdict's "without" side


class _ModifierModel:
    """Is the set enough to hang within the cap, or is one more flag needed for the rate?

    The search's model gives every config that contains the set one shared rate. Here the rate
    may drop by a factor r (a grid, log-uniform) without one flag j outside the set: hypotheses
    `none` (prior 1 - Settings.modifier_prior) and (j, r). With a 1/lambda prior, each has a closed-form
    likelihood in the hangs and exposure of the configs containing the set, split by j. Under
    (j, r), j is *needed* when the hang without it is slower than the cap (r / lambda > cap_j,
    cap_j derived from the configs with j when no cap was given).

    "The set is enough" also needs the prior-free guard (`enough`): the posterior leans on the
    prior's 1 - modifier_prior for "none", and where a modifier is there (every run of the
    benchmark's modifier rows; seed 002's autotune) 2-3 % of runs met a few lucky quick hangs
    without it that tipped that prior."""

    def __init__(self, search: "_Search", mask: int, candidates: list[int], cap: float | None):
        self.search, self.mask, self.candidates, self.cap = search, mask, candidates, cap
        rows = [(m, cs.hangs, cs.exposure_s) for m, cs in search.configs.items()
                if (m & mask) == mask and cs.exposure_s > 0]
        self.H = float(sum(h for _, h, _ in rows))
        self.E = float(sum(e for _, _, e in rows))
        J, R = len(candidates), len(MODIFIER_FACTORS)
        self.r = np.array(MODIFIER_FACTORS)
        HA = np.array([sum(h for m, h, _ in rows if m >> j & 1) for j in candidates], dtype=float)
        EA = np.array([sum(e for m, _, e in rows if m >> j & 1) for j in candidates], dtype=float)
        HB, EB = self.H - HA, self.E - EA
        self.HA, self.EA, self.HB, self.EB = HA, EA, HB, EB
        Eeff = EA[:, None] + EB[:, None] / self.r[None, :]                     # J x R
        self.Eeff = np.maximum(Eeff, 1e-9)
        log_ml = -HB[:, None] * np.log(self.r)[None, :] - self.H * np.log(self.Eeff)
        log_none = -self.H * math.log(max(self.E, 1e-9))
        q = search.s.modifier_prior
        prior_j = math.log(q / max(J * R, 1)) if q > 0 else -math.inf
        logs = np.concatenate([[math.log(1 - q) + log_none], (prior_j + log_ml).ravel()])
        w = np.exp(logs - logs.max())
        w /= w.sum()
        self.p_none = float(w[0])
        self.post = w[1:].reshape(J, R)
        if cap is not None:
            caps = np.full(J, cap)
        else:
            caps = np.array([search.cap_from(ha, ea) if ha > 0
                             else search.initial_cap for ha, ea in zip(HA, EA)])
        self.caps = caps
        # P(lambda < r / cap_j): the hang without j is slower than the cap
        self.p_slow = special.gammainc(max(self.H, 1e-9), self.r[None, :] / caps[:, None] * self.Eeff)
        self.needed = (self.post * self.p_slow).sum(axis=1)                     # per candidate
        # the guard's Bayes factor per candidate: "enough" (no slowdown, or x2: two triggers in
        # the failing cell halve the rate without one of them) against the mildest slowdown of the
        # grid that would make it needed; a candidate that no slowdown of the grid makes needed
        # (a generous explicit cap) needs no guard
        log_x2 = -HB * math.log(ENOUGH_FACTOR) - self.H * np.log(np.maximum(EA + EB / ENOUGH_FACTOR, 1e-9))
        log_enough = np.logaddexp(log_none, log_x2) - math.log(2.0)
        needs = self.p_slow > 0.5
        mildest = np.argmax(needs, axis=1)
        self.log_bf_enough = np.where(needs.any(axis=1), log_enough - log_ml[np.arange(J), mildest], np.inf)

    @property
    def p_enough(self) -> float:
        return 1.0 - float(self.needed.sum())

    def enough(self, alpha: float) -> bool:
        """P(the set is enough) >= 1 - alpha, and for every candidate j the data favour "at most
        x2 slower without j" over "slower by the grid's mildest factor that makes j needed" by a
        Bayes factor of 2 / alpha or more. Under a true slowdown at least that large, that factor
        is a supermartingale, so luck passes the guard with probability at most alpha / 2 (Ville's
        inequality), whatever the prior: half the error budget, as for the certification run.
        A modifier prior of 0 turns the rate check off, guard included."""
        guarded = self.search.s.modifier_prior > 0 and self.log_bf_enough.size
        if guarded and float(self.log_bf_enough.min()) < math.log(2.0 / alpha):
            return False
        return self.p_enough >= 1 - alpha

    def choose(self) -> tuple[int, float] | None:
        """The config and soak whose outcome tells most about which flag (if any) is needed, per
        expected GPU-hour."""
        s = self.search
        J = len(self.candidates)
        # the answer variable: 0 = the set is enough, 1 + i = candidate i is needed
        lam_none = max(self.H, 0.5) / max(self.E, 1e-9)
        lam = np.maximum(self.H, 0.5) / self.Eeff                                   # J x R
        mttf = 1.0 / lam_none
        # each (j, r) splits into "j needed" and "the set is enough"
        need = self.post * self.p_slow
        enough = self.post * (1 - self.p_slow)
        options = {self.mask}
        for j in self.candidates:
            options.add(self.mask | 1 << j)
            options.add(s.full & ~(1 << j))
        best, best_score = None, 0.0
        for c in sorted(options):
            if not s._ok[c]:
                continue
            has = np.array([c >> j & 1 for j in self.candidates], dtype=bool)
            rate = np.where(has[:, None], lam, lam / self.r[None, :])                 # J x R
            for k in MODIFIER_SOAKS:
                soak = k * mttf
                p_h_none = -math.expm1(-lam_none * soak)
                p_h = -np.expm1(-rate * soak)
                # joint P(answer, hang)
                joint_h = np.zeros(J + 1)
                joint_n = np.zeros(J + 1)
                joint_h[0] = self.p_none * p_h_none
                joint_n[0] = self.p_none * (1 - p_h_none)
                joint_h[1:] = (need * p_h).sum(axis=1)
                joint_n[1:] = (need * (1 - p_h)).sum(axis=1)
                joint_h[0] += (enough * p_h).sum()
                joint_n[0] += (enough * (1 - p_h)).sum()
                info = _mutual_information(joint_h, joint_n)
                mean_load_none = (1 - math.exp(-lam_none * soak)) / lam_none
                mean_load = (-np.expm1(-rate * soak) / rate)
                load = self.p_none * mean_load_none + float((self.post * mean_load).sum())
                cost = s._cost[c] * (s.s.startup_s + load)
                score = info / cost
                if score > best_score:
                    best, best_score = (c, soak), score
        return best


def _mutual_information(joint_h: np.ndarray, joint_n: np.ndarray) -> float:
    total = joint_h.sum() + joint_n.sum()
    if total <= 0:
        return 0.0
    joint = np.stack([joint_h, joint_n]) / total
    py = joint.sum(axis=0, keepdims=True)
    po = joint.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(joint > 0, joint * np.log2(joint / (po * py)), 0.0)
    return float(terms.sum())


def _settle(search: _Search, mask: int, candidates: list[int], cap: float | None,
            max_probes: int = MAX_MODIFIER_PROBES) -> tuple[_ModifierModel, bool]:
    """Soak what the modifier model picks until it decides (the set is enough, or a candidate is
    needed). Returns the last model and whether it decided (not: the probe or GPU-hour budget)."""
    alpha = 1.0 - search.s.confidence
    for probes in range(max_probes + 1):
        model = _ModifierModel(search, mask, candidates, cap)
        if model.enough(alpha) or model.needed.max() >= 1 - alpha:
            return model, True
        if probes >= max_probes or search.over_budget():
            break
        pick = model.choose()
        if pick is None:
            break
        # copies of one config are independent soaks whose exposure pools: with --parallel N the
        # rate check's serial chain (mostly the set alone, until it has hung often enough) takes
        # 1/N of the rounds for a hang or so of overshoot per batch
        search.run([(pick[0], pick[1], "rate check")] * max(1, search.s.parallel))
    return model, False


def _rate_check(search: _Search, mask: int, cap: float | None, notes: list[str],
                max_probes: int = MAX_MODIFIER_PROBES) -> tuple[int, float | None]:
    """A flag outside the set without which the hang is slower than the cap is needed for the hang
    *within the cap*: soak the configs that tell (the set alone, the set plus one flag, the failing
    cell without one flag) until the modifier model is sure either way, and add such a flag.

    Returns the grown set and, with a default cap, the cap derived from the configs that share the
    set's rate."""
    s = search.s
    alpha = 1.0 - s.confidence
    cap_out = cap if cap is not None else search.post.cap
    for _ in range(search.n):
        candidates = [j for j in range(search.n) if not mask >> j & 1]
        if not candidates:
            break
        model, decided = _settle(search, mask, candidates, cap, max_probes)
        if not decided:
            notes.append(f"the rate check stopped undecided (probe or GPU-hour budget): P(the set is "
                         f"enough to hang within the cap) = {model.p_enough:.3f}")
            return mask, None
        if model.enough(alpha):
            if cap is None:
                cap_out = search.cap_from(model.H, model.E)
            break
        i = int(np.argmax(model.needed))
        j = candidates[i]
        cap_j = float(model.caps[i])
        r = float((model.post[i] * MODIFIER_FACTORS).sum() / max(model.post[i].sum(), 1e-12))
        notes.append(f"{search.elements[j].name} is needed to hang within the cap: without it the hang is "
                     f"~x{r:.0f} slower (MTTF beyond the cap {format_duration(cap_j)}; "
                     f"P = {model.needed[i]:.3f})")
        mask |= 1 << j
        cap_out = cap_j if cap is None else cap
    return mask, cap_out


def _recheck_members(search: _Search, found: int, grown: int, cap: float | None,
                     notes: list[str]) -> tuple[int, bool]:
    """The rate check grew the search's set `found` to `grown`: is each flag of `found` still needed
    with the added flags on? The search read configs without an added flag, which hang slowly
    whatever else is on, so an innocent flag whose absence was seen only there looked necessary.
    Each flag gets the rate check's question with the rest of the grown set fixed: that rest is
    enough (drop the flag), or the hang without the flag is slower than the cap (keep it).
    Returns the set and whether every flag was decided."""
    alpha = 1.0 - search.s.confidence
    added = ", ".join(e.name for j, e in enumerate(search.elements) if (grown & ~found) >> j & 1)
    for i in range(search.n):
        bit = 1 << i
        if not found & bit:
            continue
        rest = grown & ~bit
        model, decided = _settle(search, rest, [i], cap)
        if not decided:
            notes.append(f"the rate check stopped undecided whether {search.elements[i].name} is still needed "
                         f"(probe or GPU-hour budget): P(not needed) = {model.p_enough:.3f}")
            return grown, False
        if model.enough(alpha):
            notes.append(f"{search.elements[i].name} is not needed once {added} is in the set: baseline + the "
                         f"set without it hangs as fast (P = {model.p_enough:.3f})")
            grown = rest
    return grown, True


def _soak_the_set_alone(search: _Search, mask: int, cap: float) -> None:
    """Baseline + the set gets at least MODIFIER_EVIDENCE_HANGS hangs: they are the "without" side
    of every other flag's modifier verdict at once. The rate check's guard usually saw more; under
    a generous explicit cap it has nothing to guard and the set alone may have hung only once."""
    cs = search.stats_of(mask)
    while cs.hangs and cs.hangs < MODIFIER_EVIDENCE_HANGS and search._ok[mask] and not search.over_budget():
        soak = stats.soak_for_detection(min(cs.exposure_s / cs.hangs, cap), search.s.confidence)
        before = cs.hangs
        search.run([(mask, max(soak, search.s.startup_s), "certification")])
        if cs.hangs == before:
            return


def bisect(failing_flags: Mapping[str, Any], elements: Sequence[Element], oracle: ProbeOracle,
           settings: Settings = Settings(), *, signature: str | None = None,
           context: Mapping[str, str] | None = None, context_elements: Sequence[Element] = (),
           alternatives: Mapping[str, Sequence[Any]] | None = None,
           feasible: FeasibleFn | None = None, gpu_count: GpuCountFn = default_gpu_count,
           progress: Callable[[str], None] | None = None) -> BisectResult:
    """Find the smallest set of `elements` that, over the baseline, hangs like the failing cell.

    `failing_flags` is the failing cell's full flag dict; `elements` the flags that may move to
    their baseline value; `context` names flags that cannot move and why (`context_elements`).
    `alternatives[name]` lists values to try, in order toward the baseline, once the set is known.
    `signature`: count only hangs with this signature (default: the calibration's first hang).
    """
    s = settings
    if s.verify_cap is None:
        from dataclasses import replace
        s = replace(s, verify_cap=s.mttf_cap_s is not None)
    search = _Search(failing_flags, elements, oracle, s, signature, feasible, gpu_count, progress)
    ok, cal_soak = search.calibrate()
    cal = search.stats_of(search.full)
    failing_est = cal.mttf(s.confidence) if cal.exposure_s > 0 else None

    def result(status: str, minimal_mask: int = 0, p: float = 0.0, notes: list[str] | None = None,
               values: list[ValueProbe] | None = None, cap: float = math.nan,
               minimal_est=None, certified=None, verdicts=None) -> BisectResult:
        return BisectResult(
            status=status, signature=search.signature, elements=list(elements), context=dict(context or {}),
            minimal=[e.name for i, e in enumerate(elements) if minimal_mask >> i & 1], posterior=p,
            confidence=s.confidence, mttf_cap_s=cap, failing=failing_est, minimal_mttf=minimal_est,
            certified_soak_s=certified, verdicts=verdicts or [], configs=list(search.configs.values()) + search.extra_configs,
            values=values or [], probes=search.probes, gpu_hours=search.gpu_hours, notes=notes or [],
            log=search.log, minimal_flags=search.flags_of(minimal_mask) if status == "found" else {},
            gpu_hours_by_role=dict(search.spent),
            rate_added=[e.name for i, e in enumerate(elements) if (minimal_mask & search.rate_added) >> i & 1])

    if not ok:
        bound = stats.mttf_lower_bound(cal.exposure_s, s.confidence)
        return result("not_reproduced", notes=[
            f"the failing cell did not hang with the expected signature in {cal.exposure_s:.0f}s of load: "
            f"MTTF > {bound:.0f}s at {s.confidence:.0%}; nothing to bisect"])

    cap = s.mttf_cap_s if s.mttf_cap_s else default_cap(cal.hangs, cal.exposure_s, s.cap_factor)
    notes = search.notes
    if cal.hangs < s.calibration_hangs:
        notes.append(f"calibration stopped at {cal.hangs} hang(s) (budget): the MTTF interval is wide")
    search.initial_cap = cap
    search.post = Posterior(search.n, cap, s.slow_zero_prior)
    for mask, cs in search.configs.items():
        search.post.observe(mask, cs.hangs, cs.exposure_s)
    if search.n == 0:
        lp = np.zeros(1)
        top = 0
    else:
        top = search.search()
        lp = search.post.log_posterior()
        cap = search.post.cap
    p_top = float(np.exp(lp[top]))
    status = "found" if (search.n == 0 or search.decided) and search.stats_of(top).hangs > 0 else "inconclusive"
    if status == "inconclusive":
        notes.append(f"stopped by the probe or GPU-hour budget: the best set has posterior {p_top:.3f} "
                     f"< {s.confidence}")
    if status == "found" and s.verify_cap:
        top = _drop_modifiers(search, top, cap, notes)
    if status == "found":
        grown, rate_cap = _rate_check(search, top, s.mttf_cap_s, notes)
        if rate_cap is None:
            status = "inconclusive"
        elif s.mttf_cap_s is None:
            cap = rate_cap
        search.rate_added |= grown & ~top
        if grown != top:
            top, decided = _recheck_members(search, top, grown, s.mttf_cap_s, notes)
            if not decided:
                status = "inconclusive"
            if search.stats_of(top).hangs == 0 and search._ok[top] and not search.over_budget():
                H, E = float(search.post.H[top]), float(search.post.E[top])
                search.run([(top, stats.soak_for_detection(min(E / max(H, 1.0), cap), s.confidence), "certification")])
            if search.stats_of(top).hangs == 0:
                status = "inconclusive"
                notes.append("the grown set was not seen to hang in its certification run")
    if status == "found" and s.modifier_prior > 0:
        _soak_the_set_alone(search, top, cap)
    outside = [cs for m, cs in search.configs.items() if cs.hangs and (m & top) != top]
    if outside:
        notes.append("hangs with this signature were also seen in configs without this set ("
                     + "; ".join(cs.label for cs in outside)
                     + "): another trigger (an OR of conditions) or a modifier may exist; this is one minimal set, "
                       "others may exist")
    H, E = float(search.post.H[top]), float(search.post.E[top])
    minimal_est = stats.mttf_estimate(int(H), E, s.confidence) if E > 0 else None
    certified = None
    if H > 0:
        upper = stats.mttf_upper_bound(int(H), E, s.confidence)
        certified = float(stats.soak_for_detection(min(upper, cap) if status == "found" else upper, s.confidence))
    values: list[ValueProbe] = []
    if status == "found" and s.shrink_values and alternatives and certified:
        values = _shrink_values(search, top, alternatives, certified)
    verdicts = _verdicts(search, top, context or {}, context_elements)
    return result(status, top, p_top, notes, values, cap, minimal_est, certified, verdicts)
