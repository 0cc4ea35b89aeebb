"""Build probes in virtual time from a matrix's hang model: `soakmatrix bisect --builds ... --virtual`.

Each probe soaks the failing cell's flags on one build of the ordered list; the hangs that fire are
the hang model's whose `when` matches those flags, the cell's GPU and the build (`when: {build: NAME
or ORDINAL}`: the build's ordinal, `ordinals[index]`, by default its position in the list given to
`--builds`, counting from 0; a build of the matrix's `builds:` keeps its own), at their effective MTTF,
with exponential times in load as the flag bisection's virtual oracle draws them. A dry run of a
build bisection on a planted regression, before any GPU-hour is spent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, HangModel

from .oracle import HANG, PASSED, BuildProbe, BuildProbeResult


class HangModelBuildOracle:
    def __init__(
        self,
        model: HangModel,
        flags: Mapping[str, Any],
        gpu: str | None,
        builds: Sequence[str],
        *,
        startup_s: float = 600.0,
        gpus: int = 1,
        seed: int | None = None,
        registry: Mapping[str, flagmod.Flag] | None = None,
        ordinals: Sequence[int] | None = None,
    ):
        self.model, self.gpu, self.builds = model, gpu, list(builds)
        self.ordinals = list(range(len(self.builds)) if ordinals is None else ordinals)
        self.flags = flagmod.resolve_defaults(flags, registry)
        self.startup_s, self.gpus = startup_s, gpus
        self.rng = np.random.default_rng(model.seed if seed is None else seed)

    def run(self, probes: Sequence[BuildProbe]) -> list[BuildProbeResult]:
        return [self._one(p) for p in probes]

    def _one(self, probe: BuildProbe) -> BuildProbeResult:
        build = (self.ordinals[probe.index], self.builds[probe.index])
        first_t, first = math.inf, None
        for hang in self.model.hangs:
            if hang.matches(self.flags, self.gpu, build):
                t = self.rng.exponential(hang.effective_mttf_s(self.flags))
                if t < first_t:
                    first_t, first = t, hang
        load = min(first_t, probe.soak_s)
        gpu_hours = self.gpus * (self.startup_s + load) / 3600.0
        if first is None or first_t >= probe.soak_s:
            return BuildProbeResult(probe, PASSED, None, load, gpu_hours, f"no hang in {load:.0f}s")
        # a crash ends the probe like a hang of another signature: only the target's signature counts
        return BuildProbeResult(
            probe,
            HANG,
            STYLE_SIGNATURE[first.style],
            load,
            gpu_hours,
            f"{first.id} after {load:.0f}s",
            {"hang_id": first.id},
            crashed=first.style == "crash",
        )
