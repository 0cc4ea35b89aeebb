"""The virtual-time build oracle: hang times drawn from a planted change point instead of soaks.

Builds from `change_point` on hang with the target signature at MTTF `mttf_s` (exponential times in
load, as the flag bisection's virtual oracle); builds before it never do (a `change_point` of 0
means the good build hangs too: not a regression). Optionally every build also has an unrelated
flaky hang of another signature at MTTF `background_mttf_s`, which ends a probe as a real one
would, and a share `untestable_fraction` of the builds (never the oldest or the newest) cannot be
installed or started: such a probe costs its install and start-up and answers `untestable`. With
`old_mttf_s` the builds before the change point hang with the target signature too, at that MTTF
(a rate change rather than a clean regression). Each
probe costs GPUs x (start-up + install + load actually run). A seeded numpy generator makes every
run reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from .oracle import HANG, PASSED, UNTESTABLE, BuildProbe, BuildProbeResult

TARGET_SIGNATURE = "shm_broadcast_timeout"
BACKGROUND_SIGNATURE = "nccl_watchdog_timeout"


class VirtualBuildOracle:
    def __init__(
        self,
        n_builds: int,
        change_point: int,
        mttf_s: float,
        *,
        startup_s: float = 600.0,
        seed: int | None = None,
        background_mttf_s: float | None = None,
        untestable_fraction: float = 0.0,
        untestable: Iterable[int] | None = None,
        gpus: int = 1,
        signature: str = TARGET_SIGNATURE,
        background_signature: str = BACKGROUND_SIGNATURE,
        old_mttf_s: float | None = None,
    ):
        if not 0 <= change_point < n_builds:
            raise ValueError(f"the change point must be a build index in 0..{n_builds - 1}, got {change_point}")
        self.n = n_builds
        self.change_point = change_point
        self.mttf_s = mttf_s
        self.old_mttf_s = old_mttf_s
        self.startup_s = startup_s
        self.background_mttf_s = background_mttf_s
        self.gpus = gpus
        self.signature = signature
        self.background_signature = background_signature
        self.rng = np.random.default_rng(seed)
        if untestable is None:
            inner = np.arange(1, n_builds - 1)
            count = round(untestable_fraction * len(inner))
            untestable = self.rng.choice(inner, size=count, replace=False) if count else ()
        self.untestable = frozenset(int(i) for i in untestable)
        self.virtual_s = 0.0  # virtual wall time if probes ran one after another
        self.probes = 0

    def run(self, probes: Sequence[BuildProbe]) -> list[BuildProbeResult]:
        return [self._one(p) for p in probes]

    def _hours(self, load_s: float) -> float:
        self.virtual_s += self.startup_s + load_s
        self.probes += 1
        return self.gpus * (self.startup_s + load_s) / 3600.0

    def _one(self, probe: BuildProbe) -> BuildProbeResult:
        if probe.index in self.untestable:
            return BuildProbeResult(probe, UNTESTABLE, None, 0.0, self._hours(0.0), "install failed")
        if probe.index >= self.change_point:
            target = self.rng.exponential(self.mttf_s)
        else:
            target = self.rng.exponential(self.old_mttf_s) if self.old_mttf_s else math.inf
        other = self.rng.exponential(self.background_mttf_s) if self.background_mttf_s else math.inf
        first = min(target, other)
        if first >= probe.soak_s:
            return BuildProbeResult(
                probe, PASSED, None, probe.soak_s, self._hours(probe.soak_s), f"no hang in {probe.soak_s:.0f}s"
            )
        signature = self.signature if target <= other else self.background_signature
        return BuildProbeResult(probe, HANG, signature, first, self._hours(first), f"{signature} after {first:.0f}s")
