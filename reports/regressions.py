"""Regressions from history: a cell that passed on one engine build and hangs on a later one.

A "cell" here is the build-less combination (model, GPU type, flags, workload): its runs on each
build of the matrix's `builds:` are one line across builds. Exposure and hangs are pooled per build
(hangs arrive as a Poisson process in exposure, `matrix/contracts/stats.py`); config and infra
errors say nothing about hangs and count for nothing.

For one cell, in build order: the first build with a hang or crash is the *first bad* build; the
latest build before it with exposure is the *last good* one (every build before the first bad one
is clean by construction); builds between them without a verdict are *untested*, so the change is
somewhere in (last good, first bad]. The good side's strength is the MTTF lower bound at
confidence c over its pooled exposure (no hang in T: MTTF > T / ln(1/(1-c))). It is a `regression`
finding only when that bound reaches the bad side's MTTF estimate (exposure / hangs on the first
bad build): a good side shorter than one bad MTTF would have passed by luck. A cell that hangs from
its first tested build on has no good side: not a regression.

Build order: `order` when the caller knows it (the matrix's `builds:`); otherwise from the history
itself: by the first run a build appears in, then by its ordinal in that run's matrix, so nights
that add a build append it, and the builds of one run keep their file order.

Pure functions over (run order, CellResult) rows; `rows_of(store)` reads them from a store.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.flags import format_value
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.contracts.stats import mttf_lower_bound

DEFAULT_CONFIDENCE = 0.9

Row = tuple[int, CellResult]  # (the run's order, one result)


@dataclass(frozen=True)
class BuildEvidence:
    """One cell on one build, pooled over every run."""

    build: str
    exposure_s: float = 0.0
    hangs: int = 0  # hangs and crashes
    cell_ids: tuple[str, ...] = ()  # the cell ids (with build) of the rows
    finding_ids: tuple[str, ...] = ()  # the cell ids of rows that hung or crashed
    signatures: tuple[str, ...] = ()

    @property
    def tested(self) -> bool:
        return self.exposure_s > 0 or self.hangs > 0


@dataclass(frozen=True)
class Regression:
    """A `regression` finding: the change lies in (last_good, first_bad]."""

    cell: str  # model|gpu|flags|workload (the build-less name)
    model: str
    gpu: str
    flags: Mapping[str, Any]
    workload: str
    last_good: str
    first_bad: str
    untested: tuple[str, ...]  # builds strictly between them with no verdict for this cell
    good_exposure_s: float  # pooled over the builds up to last_good
    good_mttf_lower_s: float  # MTTF > this at `confidence`, on the good side
    bad_hangs: int  # on first_bad
    bad_exposure_s: float
    confidence: float
    signature: str | None = None  # the commonest on first_bad
    bad_cell_ids: tuple[str, ...] = ()  # cells (with build) whose findings this regression explains
    builds: tuple[BuildEvidence, ...] = field(default=(), repr=False)

    @property
    def bad_mttf_s(self) -> float:
        return self.bad_exposure_s / self.bad_hangs if self.bad_hangs else math.inf

    @property
    def range_text(self) -> str:
        between = f" (untested: {', '.join(self.untested)})" if self.untested else ""
        return f"last good {self.last_good}, first bad {self.first_bad}{between}"

    def describe(self) -> str:
        """One line: the range and the strength of the evidence on both sides."""
        pct = f"{self.confidence:.0%}"
        return (
            f"{self.range_text}; {self.last_good} side: no hang in {_dur(self.good_exposure_s)}, "
            f"MTTF > {_dur(self.good_mttf_lower_s)} at {pct}; {self.first_bad}: {self.bad_hangs} "
            f"hang{'s' if self.bad_hangs != 1 else ''} in {_dur(self.bad_exposure_s)}"
            + (f" ({self.signature})" if self.signature else "")
        )

    def properties(self) -> dict[str, str]:
        """The JUnit test-case properties of a cell this regression explains (`regression.*`)."""
        return {
            "regression": self.describe(),
            "regression.last_good": self.last_good,
            "regression.first_bad": self.first_bad,
            "regression.good_mttf_lower_s": f"{self.good_mttf_lower_s:.1f}",
            "regression.confidence": f"{self.confidence:g}",
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "regression",
            "cell": self.cell,
            "model": self.model,
            "gpu": self.gpu,
            "flags": dict(self.flags),
            "workload": self.workload,
            "last_good": self.last_good,
            "first_bad": self.first_bad,
            "untested": list(self.untested),
            "good_exposure_s": round(self.good_exposure_s, 3),
            "good_mttf_lower_s": round(self.good_mttf_lower_s, 3),
            "confidence": self.confidence,
            "bad_hangs": self.bad_hangs,
            "bad_exposure_s": round(self.bad_exposure_s, 3),
            "signature": self.signature,
            "bad_cell_ids": list(self.bad_cell_ids),
            "text": self.describe(),
        }


def cell_key(result: CellResult) -> str:
    """The build-less identity of a result's cell."""
    flags = ",".join(f"{k}={format_value(v)}" for k, v in sorted(result.flags.items()))
    return f"{result.model}|{result.gpu_type}|{flags}|{result.workload}"


def build_order(rows: Iterable[Row]) -> list[str]:
    """Builds in history order: the first run each appears in, then its ordinal there."""
    first: dict[str, tuple[float, float]] = {}
    for run_order, r in rows:
        if not r.build:
            continue
        key = (float(run_order), float(r.build_ordinal) if r.build_ordinal is not None else math.inf)
        if r.build not in first or key < first[r.build]:
            first[r.build] = key
    return sorted(first, key=lambda b: (first[b], b))


def find_regressions(
    rows: Iterable[Row],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    order: Sequence[str] | None = None,
    min_ratio: float = 1.0,
) -> list[Regression]:
    """Every cell that passed on an earlier build and hangs on a later one, with its range and strength.

    `min_ratio`: the good side's MTTF lower bound must reach this many times the first bad build's
    MTTF estimate (1.0: the good side saw at least one bad MTTF's worth of load, at confidence c)."""
    rows = [(o, r) for o, r in rows if r.build]
    history = build_order(rows)
    ranked = list(dict.fromkeys([*(order or ()), *history]))
    position = {b: i for i, b in enumerate(ranked)}
    by_cell: dict[str, list[CellResult]] = {}
    for _, r in rows:
        by_cell.setdefault(cell_key(r), []).append(r)
    found = []
    for key in sorted(by_cell):
        reg = _cell_regression(key, by_cell[key], ranked, position, confidence, min_ratio)
        if reg is not None:
            found.append(reg)
    return found


def _cell_regression(
    key: str,
    results: list[CellResult],
    ranked: list[str],
    position: Mapping[str, int],
    confidence: float,
    min_ratio: float,
) -> Regression | None:
    evidence = _evidence(results)
    tested = sorted((e for e in evidence.values() if e.tested), key=lambda e: position[e.build])
    first_bad = next((i for i, e in enumerate(tested) if e.hangs), None)
    if first_bad is None or first_bad == 0:
        return None  # never hung, or hung from its first tested build: no good side
    good, bad = tested[:first_bad], tested[first_bad]
    last_good = good[-1]
    good_exposure = sum(e.exposure_s for e in good)
    lower = mttf_lower_bound(good_exposure, confidence)
    bad_mttf = bad.exposure_s / bad.hangs
    if lower < min_ratio * bad_mttf:
        return None
    lo, hi = position[last_good.build], position[bad.build]
    untested = tuple(b for b in ranked[lo + 1 : hi] if not (evidence.get(b) and evidence[b].tested))
    sample = results[0]
    bad_ids = tuple(dict.fromkeys(i for e in tested[first_bad:] for i in e.finding_ids))
    signature = Counter(bad.signatures).most_common(1)[0][0] if bad.signatures else None
    return Regression(
        cell=key,
        model=sample.model,
        gpu=sample.gpu_type,
        flags=dict(sample.flags),
        workload=sample.workload,
        last_good=last_good.build,
        first_bad=bad.build,
        untested=untested,
        good_exposure_s=good_exposure,
        good_mttf_lower_s=lower,
        bad_hangs=bad.hangs,
        bad_exposure_s=bad.exposure_s,
        confidence=confidence,
        signature=signature,
        bad_cell_ids=bad_ids,
        builds=tuple(tested),
    )


def _evidence(results: Iterable[CellResult]) -> dict[str, BuildEvidence]:
    pooled: dict[str, dict[str, Any]] = {}
    for r in results:
        p = pooled.setdefault(r.build, {"exposure": 0.0, "hangs": 0, "ids": [], "findings": [], "sigs": []})
        p["ids"].append(r.cell_id)
        outcome = Outcome(r.outcome)
        if outcome is Outcome.PASSED or outcome.is_finding:
            p["exposure"] += max(0.0, float(r.exposure_s or 0.0))
        if outcome.is_finding:
            p["hangs"] += 1
            p["findings"].append(r.cell_id)
            if r.signature:
                p["sigs"].append(r.signature)
    return {
        b: BuildEvidence(
            b,
            p["exposure"],
            p["hangs"],
            tuple(dict.fromkeys(p["ids"])),
            tuple(dict.fromkeys(p["findings"])),
            tuple(p["sigs"]),
        )
        for b, p in pooled.items()
    }


def by_cell_id(regressions: Iterable[Regression]) -> dict[str, Regression]:
    """cell id (with build) -> the regression that explains its hang."""
    return {cid: reg for reg in regressions for cid in reg.bad_cell_ids}


def annotate(results: Iterable[CellResult], regressions: Iterable[Regression]) -> list[CellResult]:
    """The results with `regression` set (JUnit's `regression.*` properties) where one explains them."""
    index = by_cell_id(regressions)
    out = []
    for r in results:
        reg = index.get(r.cell_id)
        if reg is not None and Outcome(r.outcome).is_finding:
            r = replace(r, regression=dict(reg.properties()))
        out.append(r)
    return out


def rows_of(store: Any, skip_run: str | None = None) -> list[Row]:
    """Every result with a build in a history store (`reports.history.HistoryStore`), with its run's
    order; `skip_run`'s results left out (the run being written: `RunRegressions` adds them)."""
    rows: list[Row] = []
    if not any(cell.name.count("|") >= 4 for cell in store.cells().values()):
        return rows  # no cell was ever run on a build (its name's fifth part): nothing to parse
    for seq, run in enumerate(store.runs()):
        if run.id != skip_run:
            rows.extend((seq, r) for r in store.results(run.id) if r.build)
    return rows


class RunRegressions:
    """For a run being written: the history's other runs read once, the run's own results at each call."""

    def __init__(self, store: Any, run_id: str, confidence: float = DEFAULT_CONFIDENCE) -> None:
        self.seq = next((i for i, run in enumerate(store.runs()) if run.id == run_id), 0)
        self.past = rows_of(store, skip_run=run_id)
        self.confidence = confidence

    def annotate(self, results: Sequence[CellResult]) -> list[CellResult]:
        """`results` (the run's) with the regressions of the whole history attached."""
        rows = [*self.past, *((self.seq, r) for r in results if r.build)]
        return annotate(results, find_regressions(rows, confidence=self.confidence))


def _dur(seconds: float) -> str:
    return format_duration(seconds) if math.isfinite(seconds) else "inf"
