"""The build probe oracle: what build bisection asks of the world, and what it gets back.

A probe installs and starts one build (an engine version, a wheel, an image) with the failing cell's
flags, model, GPU and workload, soaks it for at most `soak_s` seconds of load and stops at the first
hang. Its answer is one of:

* `hang`: a hang, with its signature (only the target signature counts as "this build is bad";
  any other signature ends the probe early and is counted on its own),
* `passed`: no hang in `soak_s`,
* `untestable`: the build could not be installed or started (a `config_error`/`infra_error` of the
  soak); it says nothing about the hang,

with the exposure (load seconds up to the hang) and the GPU-hours spent, install and start-up
included. Bisection never looks at a clock or a process: `oracle_virtual.VirtualBuildOracle` draws
times, `oracle_hangmodel.HangModelBuildOracle` draws them from a matrix's hang model, and
`oracle_soak.BuildSoakOracle` soaks real builds, each probe a soak job on Ray in the build's
runtime_env. `convert` turns the flag bisection's probe results into build probe results, for
them and for `FlagOracleAdapter`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from soakmatrix.matrix.bisect.oracle_chunked import Pieces

HANG = "hang"
PASSED = "passed"
UNTESTABLE = "untestable"
OUTCOMES = (HANG, PASSED, UNTESTABLE)


@dataclass(frozen=True)
class BuildProbe:
    index: int  # position in the ordered list (0 = oldest, the good side)
    build: str  # the build's name or spec
    soak_s: float  # stop after this much load without a hang


@dataclass(frozen=True)
class BuildProbeResult:
    probe: BuildProbe
    outcome: str  # hang | passed | untestable
    signature: str | None  # the hang's signature; None unless outcome == "hang"
    exposure_s: float  # seconds under load, up to the hang if there was one
    gpu_hours: float  # GPUs x (install + start-up + exposure)
    message: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    crashed: bool = False  # the "hang" was a crash: the target only when named (never by default)

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"a build probe's outcome is one of {OUTCOMES}, got {self.outcome!r}")


class BuildOracle(Protocol):
    def run(self, probes: Sequence[BuildProbe]) -> list[BuildProbeResult]:
        """Soak every probe (in parallel where possible); results in the order of `probes`."""
        ...


class FlagOracleAdapter:
    """A build oracle over a flag bisection `ProbeOracle` that reads the build from the flags: each
    build probe becomes a flag probe of the failing cell's flags with `build_key` set to the build.
    The flag `SoakOracle` plans no build from a flag (a build is not a flag: it is the cell's
    runtime_env), so real builds go through `oracle_soak.BuildSoakOracle` instead. A crash counts
    as a hang with its signature (as in the flag bisection); config and infra errors make the build
    untestable."""

    def __init__(
        self,
        oracle: Any,
        flags: Mapping[str, Any],
        build_key: str = "build",
        probe_factory: Callable[..., Any] | None = None,
    ):
        self.oracle = oracle
        self.flags = dict(flags)
        self.build_key = build_key
        if probe_factory is None:
            from soakmatrix.matrix.bisect.oracle import Probe

            probe_factory = Probe
        self.probe_factory: Callable[..., Any] = probe_factory

    def run(self, probes: Sequence[BuildProbe]) -> list[BuildProbeResult]:
        flag_probes = [
            self.probe_factory(
                flags={**self.flags, self.build_key: p.build}, soak_s=p.soak_s, label=f"{self.build_key}={p.build}"
            )
            for p in probes
        ]
        return [convert(p, r) for p, r in zip(probes, self.oracle.run(flag_probes), strict=True)]


def convert(probe: BuildProbe, result: Any) -> BuildProbeResult:
    """A flag oracle's `ProbeResult` (outcome passed|hang|crash|config_error|infra_error) as a build
    probe's answer."""
    outcome = str(getattr(result.outcome, "value", result.outcome))
    if outcome in ("hang", "crash"):
        kind, signature = HANG, result.signature or outcome
    elif outcome == "passed":
        kind, signature = PASSED, None
    else:
        kind, signature = UNTESTABLE, None
    return BuildProbeResult(
        probe,
        kind,
        signature,
        float(result.exposure_s),
        float(result.gpu_hours),
        getattr(result, "message", ""),
        dict(getattr(result, "extra", {}) or {}),
        crashed=outcome == "crash",
    )


def _combine_pieces(probe: BuildProbe, pieces: list[BuildProbeResult]) -> BuildProbeResult:
    last = pieces[-1]
    if len(pieces) == 1 and last.probe == probe:
        return last
    gpu_hours = sum(p.gpu_hours for p in pieces)
    if last.outcome == UNTESTABLE and len(pieces) > 1:
        # The pieces before it installed, started and soaked this build: it is testable, and their load
        # is evidence. A lost node or a failed restart later is no reason to call the build untestable
        # (the answer would become a range around a build that was soaked for hours): the probe is a
        # pass of the load that was soaked, and the bisection decides again what to soak next.
        soaked = sum(p.exposure_s for p in pieces[:-1])
        extra = {**dict(last.extra), "soaked_in_pieces": len(pieces) - 1, "interrupted": last.message}
        return BuildProbeResult(
            probe,
            PASSED,
            None,
            soaked,
            gpu_hours,
            f"no hang in {soaked:.0f}s over {len(pieces) - 1} pieces; the next piece "
            f"could not run ({last.message or 'untestable'}): a pass of {soaked:.0f}s",
            extra,
        )
    extra = {**dict(last.extra), "soaked_in_pieces": len(pieces)} if len(pieces) > 1 else dict(last.extra)
    message = last.message + (f" (soaked in {len(pieces)} pieces)" if len(pieces) > 1 else "")
    return BuildProbeResult(
        probe,
        last.outcome,
        last.signature,
        sum(p.exposure_s for p in pieces),
        gpu_hours,
        message,
        extra,
        crashed=last.crashed,
    )


# how a long build probe is soaked in pieces (`matrix/bisect/oracle_chunked.ChunkedOracle`)
BUILD_PIECES = Pieces(
    with_soak=lambda probe, load: BuildProbe(probe.index, probe.build, load),
    passed=lambda result: result.outcome == PASSED,
    combine=_combine_pieces,
)
