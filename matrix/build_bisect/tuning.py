"""The build bisection's tuning of the rate-change model and of signatures found untold, in one place.

Every field says why it has its value; `BuildSettings.tuning` carries one of these, so an ablation
(`python -m benchmarks.bench_build_bisect --tuning KEY=VALUE`) changes a value without editing code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tuning:
    # Prior that a signature's hang was there before the change point too, at a rate at least
    # `min_ratio` times lower (a rate change), rather than absent (a clean regression). It is what
    # the clean rows pay for: to name build J a clean regression, the rate change at J + 1 (J's hang
    # an old one) must be refuted too, by more hangs on J. With it low, an old hang below the change
    # reads as a clean regression there, and the search chases such hangs down the list before the
    # rates are told apart. Measured (20 seeds per row, with the aimed planner and the stall count
    # per answer): 0.2 against 0.05 finds x16 changes in 0.85-1.00 of runs instead of 0.80-1.00 at
    # 2.4-2.6 x its floor instead of 2.9-3.4 x, x4 in 0.85-1.00 instead of 0.85-0.95, and costs the
    # 24 clean and +flaky rows 3.0 % more GPU-hours on average (-8 % to +14 % per row), the five
    # +other rows 6.2 %; exact as often or more in every row. 0 is the clean-regression model alone,
    # exactly as without rate changes.
    rate_change_prior: float = 0.2
    # The smallest rate change reported: a build that multiplies the hang rate by less is no change
    # point of this model (its hangs read as one rate, "old").
    min_ratio: float = 4.0
    # The largest ratio the grid of old rates reaches: beyond it an old rate is indistinguishable
    # from none within any affordable soak (1000 x a 10 min MTTF is a week of load).
    max_ratio: float = 1000.0
    # Points of the log-uniform grid over the old rate's share (1/max_ratio .. 1/min_ratio) on which
    # it is integrated out; 10 puts neighbours within a factor 2.2, finer changed no answer.
    ratio_points: int = 10
    # With no signature named, the bad build is soaked to this many hangs (of any signatures but
    # crashes) before the search: each signature behind them is then answered on its own. One behind
    # half of the bad build's hangs escapes 6 with probability 1/64, a third with 9 %; its hangs pool
    # into its posterior, so they are not wasted (the end game pools 6 at 0.99 anyway).
    untold_calibration_hangs: int = 6
    # A search that has not raised its signature's likeliest answer for this many probes stops as
    # far as it got (that signature undecided, the budget kept): rates within a few times of each
    # other, an old hang against a rate change, can take more load than any answer is worth. At 30
    # a x4 rate change stopped undecided in 6 of 20 runs (n = 16, MTTF 30 min) before its evidence
    # was in; 60 lets those finish and still caps the runaway searches it was brought in for.
    stall_probes: int = 60
    # A signature that hung on the good build at least `old_hangs` times is answered old once that
    # answer holds this much of its posterior (and is the likeliest): the hangs there show it is
    # present at the last-good end; what is left weighs a rate change above it. Proving "old" at the
    # stated confidence would mean refuting a rate change at every build, which no affordable soak does
    # (a hang on every build, n = 8: 96 probes, inconclusive).
    old_posterior: float = 0.9
    # ... and only after this many hangs on the good build: with one, a rare old hang caught early
    # there answered 7 of 20 x4 rate changes "not a regression" (n = 16, MTTF 30 min) before the rates
    # either side of the change were told apart; a hang that is really old hangs there again soon.
    old_hangs: int = 3
    # With a hang of the target below the likeliest change point (a rate change) and that change
    # point holding this much of the posterior, only it and the build below are probed
    # (`planner.aim_at`). 0.25 measured the same within the noise of 20 seeds (n = 16, MTTF 30 min:
    # x4 65.2 against 60.9 GPU-hours, x16 39.3 against 40.4).
    aim_mass: float = 0.5

    def __post_init__(self):
        if not 0.0 <= self.rate_change_prior < 1.0:
            raise ValueError(f"rate_change_prior must be in [0, 1), got {self.rate_change_prior}")
        if not 1.0 < self.min_ratio < self.max_ratio:
            raise ValueError(f"need 1 < min_ratio < max_ratio, got {self.min_ratio}, {self.max_ratio}")
        if self.old_hangs < 1:
            raise ValueError(f"old_hangs must be >= 1, got {self.old_hangs}")
        if not 0.5 < self.old_posterior <= 1.0:
            raise ValueError(f"old_posterior must be in (0.5, 1], got {self.old_posterior}")
        if self.ratio_points < 1:
            raise ValueError(f"ratio_points must be >= 1, got {self.ratio_points}")

    def shares(self) -> np.ndarray:
        """The old rate as a share rho of the new one, on the grid (0 is the clean regression, apart)."""
        return np.geomspace(1.0 / self.min_ratio, 1.0 / self.max_ratio, self.ratio_points)
