"""The search state and the posterior search: every probe's bookkeeping, calibration, and the
search over every set of flags when removing one flag at a time cannot decide.

Calibrate the failing cell (several hangs: the MTTF gets an interval and, by default, the cap,
which then follows the pooled MTTF). Then ablation (ablation.py) runs first (pipeline.py calls
each in turn: this module imports no phase, so no phase's import comes back here). When it cannot decide
(every removal hangs, or the kept set never hangs: two triggers), the posterior search goes on from
every probe so far: it picks the config whose outcome tells most per expected GPU-hour and soaks it
until its first hang or until "it is fast" has dropped to alpha / (expected remaining probes), and
stops when the likeliest set has posterior >= confidence, every config it says is slow was soaked in
full, each of its flags passes the necessity check at alpha / n, and the set itself was seen to hang.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from soakmatrix.matrix.contracts import stats

from .model import ConfigStats, Element, FeasibleFn, GpuCountFn, Settings, default_cap, default_gpu_count
from .oracle import Probe, ProbeOracle, ProbeResult
from .posterior import Posterior, exposure_until, p_as_fast, subset_sums



def _h2(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


class Search:
    """What every stage reads and adds to: the elements, every config's stats, the probe log and
    its spend, and the posterior (from calibration on). `runnable[mask]`: the config can run;
    `cost[mask]`: its GPUs per probe."""

    def __init__(self, failing_flags: Mapping[str, Any], elements: Sequence[Element], oracle: ProbeOracle,
                 settings: Settings, signature: str | None, feasible: FeasibleFn | None,
                 gpu_count: GpuCountFn, progress: Callable[[str], None] | None):
        self.failing = dict(failing_flags)
        self.elements = list(elements)
        self.n = len(self.elements)
        self.full = (1 << self.n) - 1
        self.oracle = oracle
        self.s = settings
        self.policy = settings.policy
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
        self.cleared_groups: set[int] = set()       # group removals that ruled out a modifier among their flags
        masks = range(1 << self.n)
        if gpu_count is default_gpu_count and not any(e.name == "tp" for e in self.elements):
            self.cost = np.full(1 << self.n, float(gpu_count(self.failing)))
        else:
            self.cost = np.array([gpu_count(self.flags_of(m)) for m in masks], dtype=float)
        self.runnable = (np.ones(1 << self.n, dtype=bool) if feasible is None
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
                    self.runnable[mask] = False
                # pieces of a long probe that passed before one could not run: load without a hang
                passed = float(result.extra.get("passed_exposure_s", 0.0))
                if passed > 0:
                    cs.exposure_s += passed
                    if self.post is not None:
                        self.post.observe(mask, 0, passed)
                out.append((mask, result))
                continue
            if self.signature is None and result.hung_with(None):
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
            if cs.hangs == 0 and cs.exposure_s >= max_soak:
                # other signatures kept ending the probes: as much load as one full soak, no target hang
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
        shortest = max(self.policy.min_soak_mttfs * mttf, self.s.startup_s)
        return np.clip(soak, shortest, np.maximum(longest, shortest))

    def choose(self, lp: np.ndarray, delta: float) -> tuple[int, float]:
        n = self.n
        p_fast = np.clip(subset_sums(np.exp(lp), n), 0.0, 1.0)
        H, E = self._rate_pool(lp)
        mttf = E / H
        settling = self._soak_for(p_fast, H, E, delta)
        soak = settling
        if H < self.policy.stage_hangs:
            # lambda is still vague: refuting a config now would take a soak of many MTTFs that
            # positives (which pool more hangs) will soon shorten; soak a few MTTFs and come back
            soak = np.minimum(settling, max(self.policy.stage_mttfs * mttf, self.s.startup_s))
        detect = 1.0 - (E / (E + soak)) ** H
        p_hang = p_fast * detect
        info = _h2(p_hang) - p_fast * _h2(detect)
        expected_load = p_fast * mttf * detect + (1 - p_hang) * soak
        cost = self.cost * (self.s.startup_s + expected_load)
        score = np.where(self.runnable, info / cost, -np.inf)
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
                    and self.runnable[mask] and cs.role == "search":
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
            if not top & bit or self.necessity_soaks.get(j, 0) >= self.policy.necessity_soaks:
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
            if not self.runnable[target]:
                continue
            self.necessity_soaks[j] = self.necessity_soaks.get(j, 0) + 1
            return target, max(exposure_until(h, e, H, E, level) - e, self.s.startup_s)
        return None

    # -- the cap ----------------------------------------------------------------------------------

    def cap_from(self, hangs: float, exposure: float) -> float:
        """The default cap from a pool of configs that share the failing cell's rate."""
        return min(self.policy.cap_rise * self.initial_cap,
                   default_cap(int(hangs), exposure, self.s.cap_factor, self.policy))

    def track_cap(self, H: float, E: float) -> bool:
        """Move a default cap to the one H hangs in E give, when that differs by over 10 %.
        Returns whether it moved."""
        if self.s.mttf_cap_s is not None or H <= 0:
            return False
        cap = self.cap_from(H, E)
        if abs(cap - self.post.cap) <= 0.1 * self.post.cap:
            return False
        self.post.set_cap(cap)
        return True

    def _follow_cap(self, lp: np.ndarray) -> np.ndarray:
        """A default cap tracks the MTTF pooled over the likeliest set's configs (more hangs than
        the calibration alone, so a tighter bound). It may rise to policy.cap_rise x the calibration's:
        two lucky early calibration hangs would otherwise hold the cap far below the real MTTF
        and make every later hang look slow."""
        return self.post.log_posterior() if self.track_cap(*self._rate_pool(lp)) else lp

    # -- the search -------------------------------------------------------------------------------

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
                if not self.runnable[top]:
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

