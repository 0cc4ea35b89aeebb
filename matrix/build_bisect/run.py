"""The entry point the CLI calls: `run_build_bisection(builds, oracle, ...)`.

It takes builds as names or `specs.BuildSpec`s (the oracle receives each probe's build spec: what
Ray's runtime_env installs) and keeps the result's table in the builds' names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .algorithm import BuildSettings, bisect_builds
from .oracle import BuildOracle, BuildProbe
from .result import BuildBisectResult
from .specs import BuildSpec


class _NamedOracle:
    """Hands the oracle each build's spec, while the result speaks of names."""

    def __init__(self, oracle: BuildOracle, specs: Sequence[str]):
        self.oracle, self.specs = oracle, list(specs)

    def run(self, probes):
        inner = [BuildProbe(p.index, self.specs[p.index], p.soak_s) for p in probes]
        return [
            type(r)(p, r.outcome, r.signature, r.exposure_s, r.gpu_hours, r.message, r.extra)
            for p, r in zip(probes, self.oracle.run(inner), strict=True)
        ]


def run_build_bisection(
    builds: Sequence[str | BuildSpec],
    oracle: BuildOracle,
    *,
    confidence: float = 0.99,
    budget_gpu_hours: float | None = None,
    signature: str | None = None,
    startup_s: float = 600.0,
    gpus: int = 1,
    max_probes: int = 500,
    calibration_hangs: int = 2,
    known: Mapping[int, tuple[int, float]] | None = None,
    parallel: int = 1,
) -> BuildBisectResult:
    """Bisect `builds` (oldest = good first, bad last) through `oracle`. `signature`: the regression's
    hang signature (else the calibration's first hang's); `known`: evidence from the history, build
    index -> (target hangs, exposure seconds); `parallel`: probes soaked at once per round."""
    names = [b.name if isinstance(b, BuildSpec) else str(b) for b in builds]
    specs = [b.spec if isinstance(b, BuildSpec) else str(b) for b in builds]
    settings = BuildSettings(
        confidence=confidence,
        budget_gpu_hours=budget_gpu_hours,
        signature=signature,
        startup_s=startup_s,
        gpus=gpus,
        max_probes=max_probes,
        calibration_hangs=calibration_hangs,
        known=dict(known or {}),
        parallel=parallel,
    )
    wrapped = oracle if names == specs else _NamedOracle(oracle, specs)
    return bisect_builds(names, wrapped, settings)
