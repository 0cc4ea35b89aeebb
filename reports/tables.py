"""Text tables for terminals: runs, cells that need a look, hang signatures, bisections.

Plain aligned columns (no box drawing), so the output pastes cleanly into issues and CI logs.
Each function takes the same data the dashboard shows and returns a string ending in a newline.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from soakmatrix.matrix.outcomes import Outcome
from soakmatrix.matrix.spec import format_duration

from .history import CellInfo, Observation, Run
from .state import CellState, CellStatus, SignatureSummary

MAX_CELL_CHARS = 90


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()) -> str:
    """Columns padded to their widest entry; column indexes in `right` are right-aligned (numbers)."""
    rows = [["" if v is None else str(v) for v in row] for row in rows]
    right = set(right)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        cells = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(cells).rstrip()

    out = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return "\n".join(out) + "\n"


def runs_table(runs: Sequence[Run], observations: Iterable[Observation]) -> str:
    counts: dict[str, Counter] = {r.id: Counter() for r in runs}
    hours: dict[str, float] = {r.id: 0.0 for r in runs}
    for ob in observations:
        if ob.run_id in counts:
            counts[ob.run_id][ob.outcome] += 1
            hours[ob.run_id] += ob.exposure_s / 3600.0
    order = [Outcome.PASSED, Outcome.HANG, Outcome.CRASH, Outcome.CONFIG_ERROR, Outcome.INFRA_ERROR]
    rows = [[r.id, r.kind, f"{r.matrix}:{r.profile}", r.status or "unfinished", r.planned,
             *[counts[r.id][o] for o in order], f"{hours[r.id]:.1f}"] for r in runs]
    return format_table(["run", "kind", "matrix:profile", "status", "planned", "passed", "hang", "crash",
                         "config", "infra", "hours"], rows, right=range(4, 11))


def attention_table(states: Mapping[str, CellState], cells: Mapping[str, CellInfo], limit: int = 50) -> str:
    picked = sorted((s for s in states.values() if s.status is not CellStatus.PASSING),
                    key=lambda s: (s.status.severity, -s.hangs, -s.failing_runs, s.cell_id))
    if not picked:
        return "every cell passed every run it had a verdict in\n"
    rows = []
    for s in picked[:limit]:
        est = s.estimate
        rows.append([s.status.value, s.cell_id, _cut(cells[s.cell_id].name if s.cell_id in cells else s.cell_id),
                     history_strip(s), f"{s.failing_runs}/{s.verdict_runs}", s.hangs,
                     format_duration(est.mttf_s) if est.mttf_s else "", s.first_failing_run or "",
                     ",".join(s.signatures)])
    text = format_table(["state", "cell id", "cell", "nights", "failed", "hangs", "MTTF", "first failed",
                         "signatures"], rows, right=(4, 5, 6))
    if len(picked) > limit:
        text += f"... and {len(picked) - limit} more\n"
    return text


def signatures_table(signatures: Sequence[SignatureSummary]) -> str:
    if not signatures:
        return "no hang or crash recorded\n"
    rows = []
    for s in signatures:
        est = s.estimate
        ci = f"{format_duration(est.low_s)}-{format_duration(est.high_s)}" if est.mttf_s and est.high_s else ""
        rows.append([s.signature, s.outcome.value, s.hits, len(s.cells), f"{s.exposure_s / 3600:.1f}",
                     format_duration(est.mttf_s) if est.mttf_s else "", ci, s.first_seen_run])
    return format_table(["signature", "outcome", "hits", "cells", "hours", "MTTF", "95% CI", "first seen"],
                        rows, right=(2, 3, 4, 5))


def bisections_table(bisections: Sequence[Mapping[str, Any]]) -> str:
    if not bisections:
        return "no bisection recorded\n"
    rows = []
    for b in bisections:
        minimal = b.get("minimal_set")
        if isinstance(minimal, Mapping):
            minimal = ",".join(f"{k}={v}" for k, v in sorted(minimal.items()))
        rows.append([b.get("cell_id") or b.get("cell"), b.get("signature") or "", minimal or "",
                     b.get("confidence", ""), b.get("gpu_hours", "")])
    return format_table(["cell", "signature", "smallest hanging set", "confidence", "GPU-h"], rows, right=(3, 4))


STRIP = {Outcome.PASSED: ".", Outcome.HANG: "H", Outcome.CRASH: "C", Outcome.CONFIG_ERROR: "X",
         Outcome.INFRA_ERROR: "i", None: " "}


def history_strip(state: CellState) -> str:
    """One character per run: `.` passed, H hang, C crash, X config error, i infra error, blank not run."""
    return "".join(STRIP[o] for _, o in state.history)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 3] + "..."
