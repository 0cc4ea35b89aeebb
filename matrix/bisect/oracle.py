"""The probe oracle: what bisection asks of the world, and what it gets back.

A probe soaks one configuration (a flag dict over the failing cell's model, GPU and workload) for at
most `soak_s` seconds of load and stops at the first hang. The oracle runs a batch of probes (in
parallel where it can) and reports, for each, the hang it saw (if any) with its signature, the
exposure and the GPU-hours spent: TP x (start-up + soak actually run). Bisection never looks at a
clock or a process; `oracle_virtual` and `oracle_soak` are the two implementations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Probe:
    flags: Mapping[str, Any]  # the full flag dict of the config (baseline + elements + context)
    soak_s: float  # stop after this much load without a hang
    label: str = ""  # readable: which elements are on


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    outcome: str  # passed | hang | crash | config_error | infra_error (matrix.outcomes)
    signature: str | None  # the hang's signature, None when it passed
    exposure_s: float  # seconds under load, up to the hang if there was one
    gpu_hours: float  # TP x (start-up + exposure)
    message: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def hung(self) -> bool:
        return self.outcome in ("hang", "crash")

    def hung_with(self, signature: str | None) -> bool:
        """A hang counts for a search only when its signature matches the target's. Before the
        target is known (no signature yet), only a hang counts: a crash is never taken for the
        hang a cell was reported for (a frequent unrelated crash would otherwise become the
        target in the runs where it came first)."""
        if signature is None:
            return self.outcome == "hang"
        return self.hung and self.signature == signature


class ProbeOracle(Protocol):
    def run(self, probes: Sequence[Probe]) -> list[ProbeResult]:
        """Soak every probe (in parallel where possible); results in the order of `probes`."""
        ...
