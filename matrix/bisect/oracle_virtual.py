"""The virtual-time probe oracle: hang times drawn from a hang-model file instead of running servers.

For each probe, every hang of the model that matches the config (Hang.matches on the default-filled
flags, the GPU, the workload's concurrency against `min_running`) draws an exponential time to hang
with its effective MTTF (modifiers applied); the earliest within the soak ends the probe. GPU-hours
are accounted exactly as a real probe spends them: TP x (start-up + load actually run). A seeded
numpy generator makes every run reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, BuildId, HangModel

from .oracle import Probe, ProbeResult


class VirtualOracle:
    def __init__(
        self,
        model: HangModel,
        gpu: str | None = None,
        *,
        startup_s: float = 600.0,
        seed: int | None = None,
        concurrency: int | None = None,
        registry: Mapping[str, flagmod.Flag] | None = None,
        gpu_count: Callable[[Mapping[str, Any]], int] | None = None,
        build: BuildId | None = None,
    ):
        self.model = model
        self.build = build  # the engine build every probe runs (a hang keyed on builds needs it)
        self.gpu = gpu
        self.startup_s = startup_s
        self.rng = np.random.default_rng(model.seed if seed is None else seed)
        self.concurrency = concurrency
        self.registry = registry
        self.gpu_count = gpu_count or (lambda flags: int(flags.get("tp", 1) or 1))
        self.virtual_s = 0.0  # virtual wall time if probes ran one after another

    def run(self, probes: Sequence[Probe]) -> list[ProbeResult]:
        return [self._one(p) for p in probes]

    def _one(self, probe: Probe) -> ProbeResult:
        full = flagmod.resolve_defaults(probe.flags, self.registry)
        first_t, first = probe.soak_s, None
        for hang in self.model.hangs:
            if not hang.matches(full, self.gpu, self.build):
                continue
            if self.concurrency is not None and hang.min_running > self.concurrency:
                continue
            t = self.rng.exponential(hang.effective_mttf_s(full))
            if t < first_t:
                first_t, first = t, hang
        tp = self.gpu_count(full)
        gpu_hours = tp * (self.startup_s + first_t) / 3600.0
        self.virtual_s += self.startup_s + first_t
        if first is None:
            return ProbeResult(probe, "passed", None, first_t, gpu_hours, f"no hang in {first_t:.0f}s")
        outcome = "crash" if first.style == "crash" else "hang"
        return ProbeResult(
            probe,
            outcome,
            STYLE_SIGNATURE[first.style],
            first_t,
            gpu_hours,
            f"{first.id} after {first_t:.0f}s",
            {"hang_id": first.id},
        )
