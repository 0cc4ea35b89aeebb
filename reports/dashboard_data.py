"""What the dashboard's tables show, as plain data: the history store read once (`DashboardData`)
and the rows of its tables (the overview, cells that need a look, hang signatures with an example's
stuck frames and log lines, bisections, runs, the latest run's findings). The plotly figures are
`dashboard_figures`'; `dashboard` renders both into the page, escaping everything in its template.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.flags import format_value
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.redact import redact_text
from soakmatrix.matrix.contracts.result import CellResult

from .findings import Finding, group_findings
from .history import CellInfo, HistoryStore, RecordedResult, Run
from .nodes import node_rows
from .state import CellState, CellStatus, SignatureSummary, cell_states, new_failures, signature_summaries
from .tables import bisection_view

MAX_HISTORY_ROWS = 150  # cells shown in the status-history heatmap (worst first)
MAX_ATTENTION_ROWS = 500  # rows of the "needs a look" table
MAX_FINDINGS_PER_RUN = 200  # findings listed with their evidence for the latest run
EXAMPLES_PER_SIGNATURE = 1  # newest result per signature whose stuck frames and log lines are shown
EVIDENCE_LINES = 40  # stuck frames / log lines per signature example
FINDING_LINES = 20  # ... per finding of the latest run
MAX_FINDING_PAGES = 500  # findings with a page of their own (most hits first)
LINE_CHARS = 400  # a runaway log line is cut here (the full text is in JUnit and artifacts)

OUTCOME_ORDER = [Outcome.PASSED, Outcome.HANG, Outcome.CRASH, Outcome.CONFIG_ERROR, Outcome.INFRA_ERROR]


@dataclass
class DashboardData:
    """Everything the page shows, read from the store once."""

    store: str
    runs: list[Run]
    cells: dict[str, CellInfo]
    observations: list[RecordedResult]
    states: dict[str, CellState]
    signatures: list[SignatureSummary]
    examples: dict[str, CellResult]  # signature -> newest result with it
    latest_findings: list[CellResult]
    bisections: list[dict]
    generated_at: float = 0.0
    latest_obs: dict[str, RecordedResult] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # one per fingerprint (reports.findings)
    latest_results: list[CellResult] = field(default_factory=list)  # every result of the latest run


def collect(store: HistoryStore, now: float, known_issues: Sequence[Any] = ()) -> DashboardData:
    runs = store.runs()
    run_ids = [r.id for r in runs]
    observations = store.observations()
    states = cell_states(run_ids, observations)
    latest_obs: dict[str, RecordedResult] = {}
    for ob in observations:  # run order: the last one wins
        latest_obs[ob.cell_id] = ob
    examples: dict[str, CellResult] = {}
    for _, result in store.findings(limit_per_signature=EXAMPLES_PER_SIGNATURE):
        examples.setdefault(result.signature or "unknown", result)
    latest = latest_run_with_results(runs)
    findings = [r for _, r in store.findings(run_id=latest.id)] if latest else []
    return DashboardData(
        str(store.path),
        runs,
        store.cells(),
        observations,
        states,
        signature_summaries(run_ids, observations),
        examples,
        findings,
        store.bisections(),
        now,
        latest_obs,
        group_findings(store.fingerprinted(), observations, run_ids, known_issues),
        store.results(latest.id) if latest else [],
    )


def finding_rows(data: DashboardData) -> list[dict[str, Any]]:
    """The findings table: one row per fingerprint, linking its page and its known issue."""
    rows = []
    for f in data.findings:
        est = f.estimate
        issue = f.known_issue
        rows.append(
            {
                "fingerprint": f.fingerprint,
                "signature": f.signature or "unknown",
                "hits": f.hits,
                "cells": len(f.cells),
                "nights": f.nights,
                "mttf": est.describe(format_duration) if est.hangs else "",
                "gpu": ", ".join(f"{k} x{v}" for k, v in sorted(f.gpu.items())) or "not measured",
                "culprit": (f.example.culprit or "-")[:LINE_CHARS],
                "issue": f"{issue.id} [{issue.status}]" if issue else "new",
                "issue_url": issue.url if issue else "",
            }
        )
    return rows


# -- tables -----------------------------------------------------------------------------------------


def overview(data: DashboardData) -> dict:
    status = Counter(s.status for s in data.states.values())
    latest = latest_run_with_results(data.runs)
    return {
        "runs": len(data.runs),
        "cells": len(data.states),
        "latest": latest.id if latest else None,
        "by_status": [
            (st.value.replace("_", " "), status.get(st, 0), st.value)
            for st in (
                CellStatus.FAILING,
                CellStatus.CONSISTENTLY_FAILING,
                CellStatus.FLAKY,
                CellStatus.PASSING,
                CellStatus.NO_VERDICT,
            )
        ],
        "signatures": len(data.signatures),
        "exposure_h": sum(ob.exposure_s for ob in data.observations) / 3600.0,
        # the simulated engine runs its clock faster than the wall (time_scale): its hours under load
        # are engine hours, beside GPU-hours of wall time
        "simulated_h": sum(ob.exposure_s for ob in data.observations if ob.engine == "sim") / 3600.0,
        "gpu_hours": sum(ob.gpu_hours for ob in data.observations),
    }


def attention_rows(data: DashboardData) -> dict:
    picked = sorted((s for s in data.states.values() if s.status is not CellStatus.PASSING), key=attention_key)
    rows = []
    for state in picked[:MAX_ATTENTION_ROWS]:
        info = data.cells.get(state.cell_id)
        est = state.estimate
        rows.append(
            {
                "id": state.cell_id,
                "name": info.name if info else state.cell_id,
                "status": state.status.value,
                "first_failing": state.first_failing_run,
                "first_failing_short": short_run(state.first_failing_run or ""),
                "failing_runs": state.failing_runs,
                "verdict_runs": state.verdict_runs,
                "hangs": state.hangs,
                "exposure_h": state.exposure_s / 3600.0,
                "mttf": mttf_text(est.mttf_s, est.low_s, est.high_s),
                "signatures": ", ".join(state.signatures),
                "strip": [(run, o.value if o else "not_run") for run, o in state.history],
            }
        )
    return {"rows": rows, "total": len(picked), "shown": len(rows), "history_rows": min(len(picked), MAX_HISTORY_ROWS)}


def signature_rows(data: DashboardData) -> list[dict]:
    out = []
    for sig in data.signatures:
        example = data.examples.get(sig.signature)
        cells = []
        for cell_id in sig.cells:
            info = data.cells.get(cell_id)
            state = data.states.get(cell_id)
            cells.append(
                {
                    "id": cell_id,
                    "name": info.name if info else cell_id,
                    "status": state.status.value if state else "",
                    "hangs": state.hangs if state else 0,
                }
            )
        est = sig.estimate
        out.append(
            {
                "signature": sig.signature,
                "outcome": sig.outcome.value,
                "hits": sig.hits,
                "cells": cells,
                "first_seen": sig.first_seen_run,
                "last_seen": sig.last_seen_run,
                "exposure_h": sig.exposure_s / 3600.0,
                "mttf": mttf_text(est.mttf_s, est.low_s, est.high_s),
                "example": None
                if example is None
                else {
                    "cell": example.cell_name,
                    "message": example.message,
                    "detector": example.detector or "",
                    "frames": _lines(example.stuck_frames, EVIDENCE_LINES),
                    "log": _lines(example.log_tail, EVIDENCE_LINES),
                },
            }
        )
    return out


def bisection_rows(data: DashboardData) -> list[dict]:
    out = []
    for report in reversed(data.bisections):  # newest first
        view = bisection_view(report)
        info = data.cells.get(view["cell_id"])
        view["cell"] = info.name if info else (view["cell_name"] or str(view["cell_id"]))
        view["recorded"] = when_text(view["recorded_at"])
        out.append(view)
    return out


def run_rows(data: DashboardData) -> list[dict]:
    per_run: dict[str, Counter] = defaultdict(Counter)
    exposure: dict[str, float] = defaultdict(float)
    gpu_hours: dict[str, float] = defaultdict(float)
    for ob in data.observations:
        per_run[ob.run_id][ob.outcome] += 1
        exposure[ob.run_id] += ob.exposure_s
        gpu_hours[ob.run_id] += ob.gpu_hours
    rows = []
    for run in reversed(data.runs):
        c = per_run[run.id]
        rows.append(
            {
                "id": run.id,
                "kind": run.kind,
                "matrix": redact_text(run.matrix),
                "profile": run.profile,
                "started": when_text(run.started_at),
                "duration": format_duration(run.finished_at - run.started_at) if run.finished_at else "",
                "status": run.status or "running / unfinished",
                "planned": run.planned,
                "recorded": run.recorded,
                "counts": [c.get(o, 0) for o in OUTCOME_ORDER],
                "exposure_h": exposure[run.id] / 3600.0,
                "gpu_hours": gpu_hours[run.id],
                "new_failures": len(new_failures(run.id, data.states)),
                "meta": redact_text(
                    ", ".join(f"{k}={v}" for k, v in sorted(run.meta.items()))
                ),  # an older store's URLs
            }
        )
    return rows


def latest_run_view(data: DashboardData) -> dict | None:
    run = latest_run_with_results(data.runs)
    if run is None:
        return None
    new = set(new_failures(run.id, data.states))
    findings = []
    for r in data.latest_findings[:MAX_FINDINGS_PER_RUN]:
        state = data.states.get(r.cell_id)
        findings.append(
            {
                "name": r.cell_name,
                "outcome": r.outcome.value,
                "signature": r.signature or "",
                "detector": r.detector or "",
                "message": r.message,
                "node": r.node,
                "time_to_hang": duration_text(r.time_to_hang_s),
                "new": r.cell_id in new,
                "status": state.status.value if state else "",
                "frames": _lines(r.stuck_frames, FINDING_LINES),
                "log": _lines(r.log_tail, FINDING_LINES),
            }
        )
    return {
        "id": run.id,
        "findings": findings,
        "total": len(data.latest_findings),
        "new": len(new),
        "nodes": node_rows(data.latest_results),
    }


# -- helpers ----------------------------------------------------------------------------------------


def _lines(lines: Sequence[str], n: int) -> list[str]:
    """The last n lines, each cut to LINE_CHARS, so one noisy cell cannot bloat the page."""
    return [line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " [...]" for line in map(str, lines[-n:])]


def attention_key(state: CellState) -> tuple:
    return (state.status.severity, -state.hangs, -state.failing_runs, state.cell_id)


def latest_run_with_results(runs: Sequence[Run]) -> Run | None:
    for run in reversed(runs):
        if run.recorded:
            return run
    return runs[-1] if runs else None


def mttf_text(mttf: float | None, low: float, high: float | None) -> str:
    if mttf is None:
        return f"≥ {format_duration(low)} (95%)" if low > 0 else "–"
    return f"{format_duration(mttf)} ({format_duration(low)} – {format_duration(high) if high else '∞'})"


def flags_text(flags: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={format_value(v)}" for k, v in sorted(flags.items()))


def duration_text(seconds: Any) -> str:
    try:
        return format_duration(float(seconds)) if seconds is not None else ""
    except (TypeError, ValueError):
        return str(seconds)


def when_text(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M UTC")


def short_run(run_id: str) -> str:
    """`20261121T225500Z-3fa9c1` -> `11-21 22:55 3fa9`: readable on an axis, still unique enough."""
    head, _, tail = run_id.partition("-")
    if len(head) == 16 and head[8] == "T":
        return f"{head[4:6]}-{head[6:8]} {head[9:11]}:{head[11:13]} {tail[:4]}"
    return run_id
