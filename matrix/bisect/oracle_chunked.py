"""A probe oracle that soaks a long probe in pieces of at most `max_soak_s` of load, so that what a
driver crash or a lost node costs is one piece, not the whole soak.

Bisection of a rare hang asks for long soaks: a necessity soak runs tens of MTTFs in one probe (90
hours at an MTTF of 2 h), the calibration soaks to the first hang (up to 24 h). Soaked in one piece,
a crash of the driver loses all of it (the probe journal keeps answered probes only) and an
infrastructure error retries it from the start. Here a probe longer than the cap is asked of the
inner oracle as successive pieces: each piece that passes is an answered probe (journaled when the
inner oracle is a `journal.JournalingOracle`) and the next asks for the load still missing (by the
loads the passed pieces were asked, not the load they measured, which may fall a hair short); the
first piece that does not pass ends the probe. Exposure and GPU-hours add up over the pieces, each
piece's start-up included (the inner oracle accounts it): the price is one start-up per cap of
load, about 1.4 % at a 12 h cap and a 10 min start-up. Used for flag probes (`Probe`, here) and build
probes (`build_bisect.oracle.BUILD_PIECES`): a `Pieces` says how a probe is cut and put together.

A piece that cannot run (a lost node, a failed restart) after others passed: a build probe is then a
pass of the load soaked (the build bisection reads a pass of any length, and the build installed and
ran, so it is not untestable); a flag probe stays that error for the step that asked for it (retried
or given up, as any error), because the flag bisection reads a pass as the verdict of the soak it
asked for, but it says how much load its passed pieces soaked without a hang
(`extra["passed_exposure_s"]`), and the search counts that load in the config's exposure and
posterior: the error costs GPU-hours, not the evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .oracle import Probe, ProbeResult


@dataclass(frozen=True)
class Pieces:
    """How one kind of probe is cut into pieces and its answers put together."""

    with_soak: Callable[[Any, float], Any]  # (probe, load) -> the same probe for that load
    passed: Callable[[Any], bool]  # did this piece's soak end without a hang?
    combine: Callable[[Any, list], Any]  # (probe, its pieces' answers) -> its answer


class ChunkedOracle:
    """Wraps any probe oracle; probes up to `max_soak_s` go through as they are."""

    def __init__(self, inner: Any, max_soak_s: float, pieces: Pieces | None = None):
        if not max_soak_s > 0:
            raise ValueError("max_soak_s must be > 0")
        self.inner, self.max_soak_s = inner, max_soak_s
        self.pieces = pieces or FLAG_PIECES

    def run(self, probes: Sequence[Any]) -> list[Any]:
        """Every probe to its end; the pieces of a batch's probes run together (in parallel where the
        inner oracle can)."""
        answers: list[list] = [[] for _ in probes]
        soaked = [0.0] * len(probes)  # the load asked of the pieces that passed
        done: list[Any] = [None] * len(probes)
        todo = list(range(len(probes)))
        while todo:
            loads = [min(probes[i].soak_s - soaked[i], self.max_soak_s) for i in todo]
            asked = [self.pieces.with_soak(probes[i], load) for i, load in zip(todo, loads, strict=True)]
            again = []
            for i, load, result in zip(todo, loads, self.inner.run(asked), strict=True):
                answers[i].append(result)
                # a piece that passed soaked the load it was asked: the load a soak job measures may
                # fall milliseconds short, and asking for those would cost a start-up for nothing
                soaked[i] += load
                if self.pieces.passed(result) and probes[i].soak_s - soaked[i] > 0:
                    again.append(i)
                else:
                    done[i] = self.pieces.combine(probes[i], answers[i])
            todo = again
        return done


def _combine_flag(probe: Probe, pieces: list[ProbeResult]) -> ProbeResult:
    last = pieces[-1]
    if len(pieces) == 1 and last.probe == probe:
        return last
    if len(pieces) == 1:
        return ProbeResult(
            probe, last.outcome, last.signature, last.exposure_s, last.gpu_hours, last.message, last.extra
        )
    extra = {**dict(last.extra), "soaked_in_pieces": len(pieces)}
    if last.outcome == "infra_error":
        extra["passed_exposure_s"] = sum(p.exposure_s for p in pieces[:-1])
    return ProbeResult(
        probe,
        last.outcome,
        last.signature,
        sum(p.exposure_s for p in pieces),
        sum(p.gpu_hours for p in pieces),
        f"{last.message} (soaked in {len(pieces)} pieces)",
        extra,
    )


FLAG_PIECES = Pieces(
    with_soak=lambda probe, load: Probe(probe.flags, load, probe.label),
    passed=lambda result: result.outcome == "passed",
    combine=_combine_flag,
)
