"""A cell's state across runs, and each hang signature's reach: pure functions over observations.

A cell's verdicts are its passed / hang / crash / config_error results, in run order; infra errors
are not verdicts (nothing was learned) and are skipped. From the verdicts:

- `passing`               never failed
- `failing`               failed in the latest runs after passing before (a regression), or failed
                          in the only run with a verdict; `first_failing_run` says since when
- `consistently_failing`  failed in every run with a verdict (at least two)
- `flaky`                 failed in some runs and passed in later ones: an intermittent hang whose
                          MTTF is near the soak length (a pass never proves a hang is gone)
- `no_verdict`            only infra errors so far

Per signature: the cells it hit, the run it was first seen in, and MTTF pooled over all exposure
of those cells (every run, hung or not): exposure / hangs, with a chi-square interval. A hang's
exposure counts up to the moment it began (`time_to_hang_s`), not until its verdict.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from soakmatrix.matrix.contracts import stats
from soakmatrix.matrix.contracts.outcomes import Outcome

FAILED = frozenset({Outcome.HANG, Outcome.CRASH, Outcome.CONFIG_ERROR})
VERDICTS = FAILED | {Outcome.PASSED}


class CellStatus(str, enum.Enum):
    PASSING = "passing"
    FAILING = "failing"
    FLAKY = "flaky"
    CONSISTENTLY_FAILING = "consistently_failing"
    NO_VERDICT = "no_verdict"

    @property
    def severity(self) -> int:
        """Sort key for "what needs a look first"."""
        return _SEVERITY[self]


_SEVERITY = {
    CellStatus.FAILING: 0,
    CellStatus.CONSISTENTLY_FAILING: 1,
    CellStatus.FLAKY: 2,
    CellStatus.NO_VERDICT: 3,
    CellStatus.PASSING: 4,
}


@dataclass(frozen=True)
class Estimate:
    """MTTF = exposure / hangs with a two-sided interval; with no hangs only a lower bound."""

    exposure_s: float
    hangs: int
    mttf_s: float | None  # None without a hang
    low_s: float  # lower end (95% one-sided bound T/3 when there is no hang)
    high_s: float | None  # None: unbounded


@dataclass
class CellState:
    cell_id: str
    status: CellStatus
    history: list[tuple[str, Outcome | None]]  # (run id, outcome or None if not run), every run
    first_failing_run: str | None = None
    last_failing_run: str | None = None
    failing_runs: int = 0
    verdict_runs: int = 0
    hangs: int = 0
    exposure_s: float = 0.0
    signatures: list[str] = field(default_factory=list)  # in order first seen
    latest: Outcome | None = None  # outcome in the latest run it ran in

    @property
    def estimate(self) -> Estimate:
        return mttf_estimate(self.hangs, self.exposure_s)


@dataclass
class SignatureSummary:
    signature: str
    outcome: Outcome  # hang or crash
    cells: list[str]  # cell ids, in order first hit
    first_seen_run: str
    last_seen_run: str
    hits: int  # results with this signature
    exposure_s: float  # all exposure of the cells it hit, every run
    estimate: Estimate


class RecordedResultLike(Protocol):
    """What the state machine reads from a result (history.RecordedResult or a CellResult-like row)."""

    # read-only: the frozen history.RecordedResult qualifies
    @property
    def run_id(self) -> str: ...
    @property
    def cell_id(self) -> str: ...
    @property
    def outcome(self) -> Outcome: ...
    @property
    def signature(self) -> str | None: ...
    @property
    def exposure_s(self) -> float: ...
    @property
    def time_to_hang_s(self) -> float | None: ...


def mttf_estimate(hangs: int, exposure_s: float, confidence: float = 0.95) -> Estimate:
    """Exponential model (REFERENCE.md), computed by `soakmatrix.matrix.contracts.stats`: E/r with the
    chi-square interval (2E/chi2(1-a/2, 2r), 2E/chi2(a/2, 2r+2)); with no hang only the one-sided
    lower bound (rule of three: E/3 at 95%)."""
    est = stats.mttf_estimate(hangs, max(0.0, exposure_s), confidence)
    if hangs <= 0:
        return Estimate(exposure_s, 0, None, est.low_s, None)
    return Estimate(
        exposure_s, hangs, est.point_s, float(est.low_s), None if math.isinf(est.high_s) else float(est.high_s)
    )


def at_risk_s(ob: RecordedResultLike) -> float:
    """Exposure that counts toward MTTF: for a hang only the time under load before it began
    (`time_to_hang_s`), since the seconds between the hang and its verdict were not at risk."""
    exposure = float(ob.exposure_s or 0.0)
    if Outcome(ob.outcome) is Outcome.HANG and ob.time_to_hang_s is not None:
        return min(exposure, float(ob.time_to_hang_s)) if exposure > 0 else float(ob.time_to_hang_s)
    return exposure


def classify(verdicts: Sequence[bool]) -> CellStatus:
    """The state from a cell's verdicts in run order (True = failed)."""
    if not verdicts:
        return CellStatus.NO_VERDICT
    if not any(verdicts):
        return CellStatus.PASSING
    if all(verdicts):
        return CellStatus.CONSISTENTLY_FAILING if len(verdicts) >= 2 else CellStatus.FAILING
    first_fail = verdicts.index(True)
    if all(verdicts[first_fail:]):
        return CellStatus.FAILING  # passed, then failed every run since: a regression
    return CellStatus.FLAKY


def cell_states(run_ids: Sequence[str], observations: Iterable[RecordedResultLike]) -> dict[str, CellState]:
    """Every observed cell's state over the runs (in the given order; observations of unknown runs ignored)."""
    order = {r: i for i, r in enumerate(run_ids)}
    by_cell: dict[str, dict[str, RecordedResultLike]] = defaultdict(dict)
    for ob in observations:
        if ob.run_id in order:
            by_cell[ob.cell_id][ob.run_id] = ob
    states = {}
    for cell_id, runs in by_cell.items():
        history: list[tuple[str, Outcome | None]] = []
        verdicts: list[bool] = []
        verdict_runs: list[str] = []
        state = CellState(cell_id, CellStatus.NO_VERDICT, history)
        for run_id in run_ids:
            seen = runs.get(run_id)
            outcome = Outcome(seen.outcome) if seen is not None else None
            history.append((run_id, outcome))
            if seen is None:
                continue
            state.latest = outcome
            state.exposure_s += at_risk_s(seen)
            if outcome is Outcome.HANG:
                state.hangs += 1
            if outcome in FAILED and seen.signature and seen.signature not in state.signatures:
                state.signatures.append(seen.signature)
            if outcome in VERDICTS:
                verdicts.append(outcome in FAILED)
                verdict_runs.append(run_id)
        state.status = classify(verdicts)
        failed_runs = [r for r, failed in zip(verdict_runs, verdicts, strict=True) if failed]
        state.failing_runs, state.verdict_runs = len(failed_runs), len(verdicts)
        if failed_runs:
            state.first_failing_run, state.last_failing_run = failed_runs[0], failed_runs[-1]
        states[cell_id] = state
    return states


def signature_summaries(run_ids: Sequence[str], observations: Iterable[RecordedResultLike]) -> list[SignatureSummary]:
    """Hang and crash signatures, most hits first: cells hit, first seen, MTTF pooled over exposure."""
    order = {r: i for i, r in enumerate(run_ids)}
    obs = [ob for ob in observations if ob.run_id in order]
    exposure_by_cell: dict[str, float] = defaultdict(float)
    for ob in obs:
        exposure_by_cell[ob.cell_id] += at_risk_s(ob)
    found: dict[tuple[str, Outcome], dict] = {}
    for ob in sorted(obs, key=lambda o: order[o.run_id]):
        outcome = Outcome(ob.outcome)
        if outcome not in (Outcome.HANG, Outcome.CRASH):
            continue
        key = (ob.signature or "unknown", outcome)
        entry = found.setdefault(key, {"cells": {}, "first": ob.run_id, "last": ob.run_id, "hits": 0})
        entry["cells"].setdefault(ob.cell_id, None)
        entry["last"] = ob.run_id
        entry["hits"] += 1
    out = []
    for (signature, outcome), entry in found.items():
        cells = list(entry["cells"])
        exposure = sum(exposure_by_cell[c] for c in cells)
        out.append(
            SignatureSummary(
                signature,
                outcome,
                cells,
                entry["first"],
                entry["last"],
                entry["hits"],
                exposure,
                mttf_estimate(entry["hits"], exposure),
            )
        )
    out.sort(key=lambda s: (-s.hits, s.signature))
    return out


def new_failures(run_id: str, states: Mapping[str, CellState]) -> list[str]:
    """Cells that failed for the first time in this run."""
    return sorted(c for c, s in states.items() if s.first_failing_run == run_id)
