"""One finding per bug: hangs and crashes grouped by fingerprint across cells and nights.

The same bug hit in twenty cells over five nights is one finding, not twenty: first and last seen,
the nights (runs) and cells where it appeared, the flag values of those cells, an MTTF pooled over
all exposure of those cells (hits / exposure, with its chi-square interval from
`matrix/contracts/stats.py`), whether the GPU was busy or idle at the hang, the culprit frames of the
newest hit per role, and the known upstream issue it matches (`reports/known_issues.py`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.contracts.stats import MttfEstimate, mttf_estimate

from .history import HistoryStore, RecordedResult, Run
from .known_issues import KnownIssue, match_result
from .state import at_risk_s


@dataclass
class Finding:
    fingerprint: str
    signature: str | None
    outcome: str  # hang | crash
    hits: int
    runs: list[str]  # nights where it appeared, in run order
    cells: list[str]  # cell ids, in order first hit
    cell_names: dict[str, str]
    flags: dict[str, list[Any]]  # flag -> the values of the cells it hit
    first_seen: float
    last_seen: float
    first_run: str
    last_run: str
    exposure_s: float  # every run's exposure of the cells it hit
    estimate: MttfEstimate
    example: CellResult  # the newest hit: culprit, threads, log
    gpu: dict[str, int] = field(default_factory=dict)  # busy/idle -> hits where measured
    known_issue: KnownIssue | None = None

    @property
    def nights(self) -> int:
        return len(self.runs)

    @property
    def culprit_frames(self) -> list[str]:
        return list(self.example.stuck_frames)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "signature": self.signature,
            "outcome": self.outcome,
            "hits": self.hits,
            "nights": self.nights,
            "runs": self.runs,
            "cells": self.cells,
            "flags": self.flags,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "exposure_s": self.exposure_s,
            "mttf_s": self.estimate.point_s,
            "mttf_low_s": self.estimate.low_s,
            "mttf_high_s": self.estimate.high_s,
            "gpu": self.gpu,
            "culprit": self.example.culprit,
            "culprit_frames": self.culprit_frames,
            "known_issue": self.known_issue.to_dict() if self.known_issue else None,
        }


def group_findings(
    hits: Iterable[tuple[str, CellResult]],
    observations: Sequence[RecordedResult],
    run_order: Sequence[str],
    known: Sequence[KnownIssue] = (),
) -> list[Finding]:
    """Findings from (run id, result) pairs of fingerprinted hangs and crashes; most hits first."""
    order = {r: i for i, r in enumerate(run_order)}
    exposure_by_cell: dict[str, float] = defaultdict(float)
    for ob in observations:
        if ob.run_id in order:
            exposure_by_cell[ob.cell_id] += at_risk_s(ob)
    groups: dict[str, list[tuple[str, CellResult]]] = defaultdict(list)
    for run_id, result in sorted(hits, key=lambda h: (order.get(h[0], len(order)), h[1].started_at)):
        if result.fingerprint:
            groups[result.fingerprint].append((run_id, result))
    out = []
    for fp, items in groups.items():
        results = [r for _, r in items]
        runs = list(dict.fromkeys(run for run, _ in items))
        cells = list(dict.fromkeys(r.cell_id for r in results))
        flags: dict[str, list[Any]] = {}
        for r in results:
            for k, v in sorted(r.flags.items()):
                values = flags.setdefault(k, [])
                if v not in values:
                    values.append(v)
        exposure = sum(exposure_by_cell.get(c, 0.0) for c in cells)
        if exposure <= 0:  # hits outside the runs given (a watch incident): their own exposure
            exposure = sum(r.exposure_s for r in results)
        example = results[-1]
        gpu = Counter(str(state) for r in results if (state := r.gpu_state.get("state")))
        outcome = Counter(r.outcome.value for r in results).most_common(1)[0][0]
        issue = next((i for i in (match_result(known, r) for r in reversed(results)) if i is not None), None)
        out.append(
            Finding(
                fp,
                example.signature,
                outcome,
                len(results),
                runs,
                cells,
                {r.cell_id: r.cell_name for r in results},
                flags,
                min(r.started_at for r in results),
                max(r.started_at for r in results),
                runs[0],
                runs[-1],
                exposure,
                mttf_estimate(len(results), exposure),
                example,
                dict(gpu),
                issue,
            )
        )
    out.sort(key=lambda f: (-f.hits, -f.last_seen, f.fingerprint))
    return out


def findings(store: HistoryStore, known: Sequence[KnownIssue] = (), runs: Sequence[Run] | None = None) -> list[Finding]:
    """Every finding of the store, grouped by fingerprint across its runs."""
    runs = store.runs() if runs is None else runs
    return group_findings(store.fingerprinted(), store.observations(), [r.id for r in runs], known)


def role_sections(result: CellResult, max_frames: int = 20) -> list[tuple[str, list[dict[str, Any]]]]:
    """(role, threads) in the order the finding shows them: the culprit's role first, each role's
    culprits before its victims (`CellResult.threads`, written by jobs/culprit.py)."""
    sections: dict[str, list[dict[str, Any]]] = {}
    for t in result.threads:
        sections.setdefault(str(t.get("role", "?")), []).append({**t, "frames": list(t.get("frames", []))[:max_frames]})
    return list(sections.items())
