"""The probe ledger every phase reads: the elements, every config's stats, the probe log and its
spend, the posterior; running a batch of probes, calibrating the failing cell, and the default cap
that follows the pooled MTTF.

Only its own methods change it (a probe's outcome, the posterior and its cap); what a phase decides
(the kept set, the flags the rate check added, the cleared groups, the notes) is handed on
explicitly (pipeline.py). It imports no phase.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from .model import ConfigStats, Element, FeasibleFn, GpuCountFn, Settings, default_cap, default_gpu_count
from .oracle import Probe, ProbeOracle, ProbeResult
from .posterior import Posterior

T = TypeVar("T")


class Search:
    """What every stage reads and adds to: the elements, every config's stats, the probe log and
    its spend, and the posterior (from calibration on). `runnable[mask]`: the config can run;
    `cost[mask]`: its GPUs per probe."""

    def __init__(
        self,
        failing_flags: Mapping[str, Any],
        elements: Sequence[Element],
        oracle: ProbeOracle,
        settings: Settings,
        signature: str | None,
        feasible: FeasibleFn | None,
        gpu_count: GpuCountFn,
        progress: Callable[[str], None] | None,
    ):
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
        self._post: Posterior | None = None  # from calibration on (start_posterior)
        self.initial_cap = math.nan  # the cap calibration gave
        self.spent: dict[str, float] = {}  # GPU-hours by role (calibration, search, ...)
        masks = range(1 << self.n)
        if gpu_count is default_gpu_count and not any(e.name == "tp" for e in self.elements):
            self.cost = np.full(1 << self.n, float(gpu_count(self.failing)))
        else:
            self.cost = np.array([gpu_count(self.flags_of(m)) for m in masks], dtype=float)
        self.runnable = (
            np.ones(1 << self.n, dtype=bool)
            if feasible is None
            else np.array([self._feasible_mask(m) for m in masks], dtype=bool)
        )

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

    def pooled(self, mask: int) -> tuple[float, float]:
        """Hangs and exposure pooled over every config that contains `mask`."""
        rows = [cs for m, cs in self.configs.items() if (m & mask) == mask]
        return float(sum(cs.hangs for cs in rows)), float(sum(cs.exposure_s for cs in rows))

    def lacking(self, mask: int, bit: int) -> tuple[int, float]:
        """Hangs and exposure pooled over every config that contains `mask` but for `bit`."""
        rest = mask & ~bit
        rows = [cs for m, cs in self.configs.items() if (m & rest) == rest and not m & bit]
        return sum(cs.hangs for cs in rows), sum(cs.exposure_s for cs in rows)

    def dealt(self, items: list[T]) -> list[tuple[T, int]]:
        """The first --parallel items, each with its copies: with fewer items than the width, the
        width is dealt out round-robin (copies of a config are independent soaks whose exposure pools)."""
        width = max(1, self.s.parallel)
        picked = items[:width]
        return [(item, len(range(i, width, len(picked)))) for i, item in enumerate(picked)]

    def over_budget(self) -> bool:
        s = self.s
        return self.probes >= s.max_probes or (s.budget_gpu_hours is not None and self.gpu_hours >= s.budget_gpu_hours)

    # -- running probes ---------------------------------------------------------------------------

    def run(self, batch: list[tuple[int, float, str]]) -> list[tuple[int, ProbeResult]]:
        probes = [Probe(self.flags_of(mask), soak, self.label(mask)) for mask, soak, _ in batch]
        results = self.oracle.run(probes)
        out = []
        for (mask, soak, role), result in zip(batch, results, strict=True):
            self._spend(result, role)
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
                    if self._post is not None:
                        self._post.observe(mask, 0, passed)
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
            if self._post is not None:
                self._post.observe(mask, int(target), result.exposure_s)
            self.progress(
                f"probe {self.probes}: {cs.label}: "
                f"{'HANG ' + str(result.signature) if result.hung else 'no hang'} after "
                f"{result.exposure_s:.0f}s (cumulative {cs.hangs} hangs / {cs.exposure_s:.0f}s)"
            )
            out.append((mask, result))
        return out

    def _spend(self, result: ProbeResult, role: str) -> None:
        """A probe into the log, the probe count and the spend (by role)."""
        self.log.append(result)
        self.probes += 1
        self.gpu_hours += result.gpu_hours
        self.spent[role] = self.spent.get(role, 0.0) + result.gpu_hours

    def run_aside(
        self, flags: dict[str, Any], soak: float, label: str, config_label: str
    ) -> tuple[ProbeResult, ConfigStats]:
        """One shrink probe of flags no mask names (another value of a flag of the set): in the log
        and the spend, its stats a config of its own; the caller reads the outcome into them."""
        result = self.oracle.run([Probe(flags, soak, label)])[0]
        self._spend(result, "shrink")
        cs = ConfigStats(-1, config_label, flags, role="shrink", probes=1, gpu_hours=result.gpu_hours)
        self.extra_configs.append(cs)
        return result, cs

    # -- calibration ------------------------------------------------------------------------------

    def calibrate(self) -> tuple[bool, float]:
        s = self.s
        cs = self.stats_of(self.full)
        cs.role = "calibration"
        max_soak = s.calibration_max_soak_s
        if max_soak is None:
            p = self.policy
            max_soak = p.calibration_soak_caps * s.mttf_cap_s if s.mttf_cap_s else p.calibration_soak_s
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

    def start_posterior(self, cap: float) -> None:
        """Calibration is done: the posterior over the sets starts at `cap`, from every probe so far."""
        self.initial_cap = cap
        self._post = Posterior(self.n, cap, self.s.slow_zero_prior, self.policy)
        for mask, cs in self.configs.items():
            self._post.observe(mask, cs.hangs, cs.exposure_s)

    @property
    def post(self) -> Posterior:
        """The posterior over the sets (calibration starts it)."""
        if self._post is None:
            raise RuntimeError("the posterior starts once calibration is done")
        return self._post

    # -- the cap ----------------------------------------------------------------------------------

    def cap_from(self, hangs: float, exposure: float) -> float:
        """The default cap from a pool of configs that share the failing cell's rate."""
        return min(
            self.policy.cap_rise * self.initial_cap, default_cap(int(hangs), exposure, self.s.cap_factor, self.policy)
        )

    def track_cap(self, H: float, E: float) -> bool:
        """Move a default cap to the one H hangs in E give, when that differs by over policy.cap_move.
        Returns whether it moved."""
        if self.s.mttf_cap_s is not None or H <= 0:
            return False
        cap = self.cap_from(H, E)
        if abs(cap - self.post.cap) <= self.policy.cap_move * self.post.cap:
            return False
        self.post.set_cap(cap)
        return True
