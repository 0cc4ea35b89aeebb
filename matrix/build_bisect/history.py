"""The history store as evidence for a build bisection (`soakmatrix bisect --builds ... --store FILE`).

Nightly runs of the failing cell on builds of the list have already soaked some of them: each such
result pools into the bisection's posterior like a probe that costs nothing now
(`run_build_bisection(known={index: (target hangs, exposure seconds)})`). "The failing cell" is the
build-less combination (model, GPU type, flags, workload: `reports.regressions.cell_key`); a
result of it on a build named in the list is evidence for that build.

As for probes: exposure is load up to the first hang; only hangs (or crashes) of the target
signature count as hangs, any other signature only adds its exposure; config and infra errors say
nothing. With no target signature named, the newest hang of the cell on the listed builds names it
(a hang before a crash, as the flag bisection takes it from the store). Pure but for `read_results`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.regressions import cell_key


@dataclass(frozen=True)
class HistoryEvidence:
    source: str  # the store's path
    known: dict[int, tuple[int, float]] = field(default_factory=dict)  # build index -> (target hangs, exposure s)
    results: int = 0  # results of the cell on listed builds that count
    other_hangs: int = 0  # hangs of other signatures (exposure only)
    signature: str | None = None  # the target they were counted against

    @property
    def target_hangs(self) -> int:
        return sum(h for h, _ in self.known.values())

    @property
    def exposure_s(self) -> float:
        return sum(e for _, e in self.known.values())

    def to_json(self, builds: Sequence[str]) -> dict[str, Any]:
        return {
            "store": self.source,
            "results": self.results,
            "target_hangs": self.target_hangs,
            "other_hangs": self.other_hangs,
            "exposure_s": round(self.exposure_s, 3),
            "builds": {builds[i]: {"hangs": h, "exposure_s": round(e, 3)} for i, (h, e) in sorted(self.known.items())},
        }


def read_results(store: Any) -> list[CellResult]:
    """Every result with a build in a `reports.history.HistoryStore`, oldest run first."""
    return [r for run in store.runs() for r in store.results(run.id) if r.build]


def cell_results(
    results: Iterable[CellResult], model: str, gpu: str, flags: dict, workload: str, builds: Sequence[str]
) -> list[CellResult]:
    """The results of this build-less cell on builds of the list, in the order given."""
    probe = CellResult(
        cell_id="",
        cell_name="",
        outcome=Outcome.PASSED,
        model=model,
        gpu_type=gpu,
        workload=workload,
        flags=dict(flags),
    )
    key, listed = cell_key(probe), set(builds)
    return [r for r in results if r.build in listed and cell_key(r) == key]


def newest_signature(results: Sequence[CellResult]) -> str | None:
    """The newest hang's signature among `results` (oldest first), else the newest crash's."""
    for wanted in (Outcome.HANG, Outcome.CRASH):
        found = [r.signature for r in results if Outcome(r.outcome) is wanted and r.signature]
        if found:
            return found[-1]
    return None


def evidence(
    results: Sequence[CellResult], builds: Sequence[str], signature: str | None, source: str
) -> HistoryEvidence:
    """Pool `results` (the cell's, from `cell_results`) per build of `builds`."""
    index = {b: i for i, b in enumerate(builds)}
    known: dict[int, tuple[int, float]] = {}
    counted = others = 0
    for r in results:
        outcome = Outcome(r.outcome)
        if outcome is not Outcome.PASSED and not outcome.is_finding:
            continue  # config and infra errors: the build did not run, nothing about hangs
        exposure = max(0.0, float(r.exposure_s or 0.0))
        if outcome.is_finding and r.time_to_hang_s is not None:
            exposure = min(exposure, r.time_to_hang_s) if exposure else float(r.time_to_hang_s)
        target = outcome.is_finding and signature is not None and r.signature == signature
        if outcome.is_finding and not target:
            others += 1
        hangs, seen = known.get(index[r.build], (0, 0.0))
        known[index[r.build]] = (hangs + int(target), seen + exposure)
        counted += 1
    return HistoryEvidence(source, known, counted, others, signature)
