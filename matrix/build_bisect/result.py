"""What a build bisection answers: its status and `BuildBisectResult` (the headline signature's
answer, every signature's, the evidence per build and the spend)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .posterior import BuildEvidence
from .signatures import SignatureAnswer

FOUND = "found"
RANGE = "range"
NOT_A_REGRESSION = "not_a_regression"
NOT_REPRODUCED = "not_reproduced"
INCONCLUSIVE = "inconclusive"
BAD_UNTESTABLE = "bad_build_untestable"
RATE_CHANGE = "rate_change"


@dataclass
class BuildBisectResult:
    status: str
    builds: list[str]
    confidence: float
    signature: str | None
    first_bad: int | None = None  # index of the first bad build (found)
    range: tuple[int, int] | None = None  # (first, last) index of the likeliest group
    posterior: float = 0.0  # of that group
    alternatives: list[tuple[int, int, float]] = field(default_factory=list)  # next likeliest groups
    mttf_s: float = math.nan  # pooled over the builds known bad
    mttf_low_s: float = math.nan
    mttf_high_s: float = math.nan
    target_hangs: int = 0
    good_mttf_bound_s: float | None = None  # last good build: MTTF above this at `confidence`
    evidence: list[BuildEvidence] = field(default_factory=list)
    probes: int = 0
    gpu_hours: float = 0.0
    gpu_hours_by_role: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rounds: int = 0  # batches of probes soaked at once (wall time, in soaks)
    signatures: list[SignatureAnswer] = field(default_factory=list)  # every signature seen, target first
    mttf_before_low_s: float | None = None  # rate_change: below the change point, MTTF at least this

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
