"""What the dashboard shows, as plain data: the history store read once (`DashboardData`), the
plotly figures (the matrix heatmap, the status history, outcomes per run) and the rows of its
tables (cells that need a look, hang signatures with an example's stuck frames and log lines,
bisections, runs, the latest run's findings). `dashboard` renders it into the page.

Log lines are untrusted: strings plotly renders are HTML-escaped here, as plotly reads a few tags;
everything else is escaped by the template.
"""

from __future__ import annotations

import html
import math
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

# heatmap colour codes: categories 0-3, hangs 4..5 by MTTF (5 = shortest)
HEAT_CODE = {Outcome.PASSED: 0, Outcome.CONFIG_ERROR: 1, Outcome.INFRA_ERROR: 2, Outcome.CRASH: 3, Outcome.HANG: 4}
MTTF_SCALE_S = (60.0, 24 * 3600.0)  # 1 min (darkest) .. 24 h (lightest hang colour)
COLOURS = {
    "passed": "#2e9d5b",
    "config_error": "#9e9e9e",
    "infra_error": "#90a4ae",
    "crash": "#7b3fa0",
    "hang_long": "#fdb863",
    "hang_short": "#8b0000",
    "not_run": "#f4f4f4",
}
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
    latest = _latest_run_with_results(runs)
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


# -- figures ----------------------------------------------------------------------------------------


def figures(data: DashboardData) -> dict[str, dict]:
    return {"heatmap": heatmap_figure(data), "history": history_figure(data), "runs": runs_figure(data)}


def heat_value(state: CellState, latest: RecordedResult | None) -> float | None:
    """Colour code of a cell: a cell that ever hung is coloured by its pooled MTTF, else by outcome."""
    if state.hangs:
        mttf = state.estimate.mttf_s or MTTF_SCALE_S[1]
        lo, hi = (math.log10(v) for v in MTTF_SCALE_S)
        shortness = (hi - math.log10(max(MTTF_SCALE_S[0], min(MTTF_SCALE_S[1], mttf)))) / (hi - lo)
        return HEAT_CODE[Outcome.HANG] + shortness
    outcomes = [o for _, o in state.history if o is not None]
    if Outcome.CRASH in outcomes:
        return HEAT_CODE[Outcome.CRASH]
    if latest is None:
        return None
    verdicts = [o for o in outcomes if o is not Outcome.INFRA_ERROR]
    return HEAT_CODE[verdicts[-1]] if verdicts else HEAT_CODE[Outcome.INFRA_ERROR]


def heatmap_figure(data: DashboardData) -> dict:
    placed = []
    for cell_id, state in data.states.items():
        info = data.cells.get(cell_id)
        if info is None:
            continue
        row = f"{info.model} · {info.gpu}"
        col = flags_text(info.flags) + (f" | {info.workload}" if info.workload else "")
        placed.append((row, col, cell_id, info, state))
    row_labels = sorted({p[0] for p in placed})
    col_labels = sorted({p[1] for p in placed})
    rows = {label: i for i, label in enumerate(row_labels)}
    cols = {label: i for i, label in enumerate(col_labels)}
    z: list[list[float | None]] = [[None] * len(col_labels) for _ in row_labels]
    text: list[list[str]] = [[""] * len(col_labels) for _ in row_labels]
    for row, col, cell_id, info, state in placed:
        latest = data.latest_obs.get(cell_id)
        z[rows[row]][cols[col]] = heat_value(state, latest)
        text[rows[row]][cols[col]] = _esc_plotly(_cell_hover(info, state, latest))
    scale = heatmap_figure_scale()
    many = len(col_labels) > 8  # long flag-combination labels would squeeze the plot: hover instead
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": [_esc_plotly(c) for c in col_labels],
                "y": [_esc_plotly(r) for r in row_labels],
                "text": text,
                "hovertemplate": "%{text}<extra></extra>",
                "zmin": 0,
                "zmax": 5,
                "colorscale": scale,
                "xgap": 1,
                "ygap": 1,
                "hoverongaps": False,
                "colorbar": {
                    "tickvals": [0.5, 1.5, 2.5, 3.5, 4.15, 4.85],
                    "ticktext": [
                        "passed",
                        "config error",
                        "infra error",
                        "crash",
                        "hang, MTTF ≥ 24 h",
                        "hang, MTTF ≤ 1 min",
                    ],
                    "thickness": 14,
                    "len": 1.0,
                },
            }
        ],
        "layout": {
            "margin": {"l": 10, "r": 10, "t": 10, "b": 10},
            "height": max(260, 90 + 30 * len(row_labels) + (0 if many else 220)),
            "xaxis": {
                "showticklabels": not many,
                "tickangle": -40,
                "automargin": True,
                "title": {"text": f"{len(col_labels)} flag combinations" + (" (hover for names)" if many else "")},
            },
            "yaxis": {"automargin": True, "autorange": "reversed"},
            "plot_bgcolor": COLOURS["not_run"],
        },
    }


def history_figure(data: DashboardData) -> dict:
    """Status per night of the cells that need a look (worst first), one row per cell."""
    run_ids = [r.id for r in data.runs]
    picked = sorted((s for s in data.states.values() if s.status is not CellStatus.PASSING), key=_attention_key)[
        :MAX_HISTORY_ROWS
    ]
    code = {Outcome.PASSED: 0, Outcome.CONFIG_ERROR: 1, Outcome.INFRA_ERROR: 2, Outcome.CRASH: 3, Outcome.HANG: 4.8}
    z, text, labels = [], [], []
    for state in picked:
        info = data.cells.get(state.cell_id)
        name = info.name if info else state.cell_id
        labels.append(f"{state.cell_id} {state.status.value}")
        z.append([code[o] if o is not None else None for _, o in state.history])
        text.append([_esc_plotly(f"{name}<br>{run}: {o.value if o else 'not run'}") for run, o in state.history])
    scale = heatmap_figure_scale()
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z,
                "x": [_short_run(r) for r in run_ids],
                "y": labels,
                "text": text,
                "hovertemplate": "%{text}<extra></extra>",
                "zmin": 0,
                "zmax": 5,
                "colorscale": scale,
                "showscale": False,
                "xgap": 1,
                "ygap": 1,
                "hoverongaps": False,
            }
        ],
        "layout": {
            "margin": {"l": 10, "r": 10, "t": 10, "b": 10},
            "height": max(200, 110 + 16 * len(labels)),
            "xaxis": {"type": "category", "automargin": True, "tickangle": -40, "side": "top"},
            "yaxis": {
                "automargin": True,
                "autorange": "reversed",
                "type": "category",
                "tickfont": {"family": "monospace", "size": 10},
            },
            "plot_bgcolor": COLOURS["not_run"],
        },
    }


def heatmap_figure_scale() -> list:
    c = COLOURS
    return [
        [0.0, c["passed"]],
        [0.199, c["passed"]],
        [0.2, c["config_error"]],
        [0.399, c["config_error"]],
        [0.4, c["infra_error"]],
        [0.599, c["infra_error"]],
        [0.6, c["crash"]],
        [0.799, c["crash"]],
        [0.8, c["hang_long"]],
        [1.0, c["hang_short"]],
    ]


def runs_figure(data: DashboardData) -> dict:
    """Outcomes per run, stacked."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for ob in data.observations:
        counts[ob.run_id][ob.outcome] += 1
    x = [_short_run(r.id) for r in data.runs]
    colour = {
        Outcome.PASSED: COLOURS["passed"],
        Outcome.HANG: COLOURS["hang_short"],
        Outcome.CRASH: COLOURS["crash"],
        Outcome.CONFIG_ERROR: COLOURS["config_error"],
        Outcome.INFRA_ERROR: COLOURS["infra_error"],
    }
    traces = [
        {
            "type": "bar",
            "name": o.value.replace("_", " "),
            "x": x,
            "y": [counts[r.id][o] for r in data.runs],
            "marker": {"color": colour[o]},
        }
        for o in OUTCOME_ORDER
    ]
    return {
        "data": traces,
        "layout": {
            "barmode": "stack",
            "height": 300,
            "margin": {"l": 10, "r": 10, "t": 10, "b": 10},
            "xaxis": {"type": "category", "automargin": True, "tickangle": -40},
            "yaxis": {"title": {"text": "cells"}, "automargin": True},
            "legend": {"orientation": "h", "y": 1.12},
        },
    }


# -- tables -----------------------------------------------------------------------------------------


def overview(data: DashboardData) -> dict:
    status = Counter(s.status for s in data.states.values())
    latest = _latest_run_with_results(data.runs)
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
    picked = sorted((s for s in data.states.values() if s.status is not CellStatus.PASSING), key=_attention_key)
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
                "first_failing_short": _short_run(state.first_failing_run or ""),
                "failing_runs": state.failing_runs,
                "verdict_runs": state.verdict_runs,
                "hangs": state.hangs,
                "exposure_h": state.exposure_s / 3600.0,
                "mttf": _mttf_text(est.mttf_s, est.low_s, est.high_s),
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
                "mttf": _mttf_text(est.mttf_s, est.low_s, est.high_s),
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
    run = _latest_run_with_results(data.runs)
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
                "time_to_hang": _dur(r.time_to_hang_s),
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


def _attention_key(state: CellState) -> tuple:
    return (state.status.severity, -state.hangs, -state.failing_runs, state.cell_id)


def _latest_run_with_results(runs: Sequence[Run]) -> Run | None:
    for run in reversed(runs):
        if run.recorded:
            return run
    return runs[-1] if runs else None


def _cell_hover(info: CellInfo, state: CellState, latest: RecordedResult | None) -> str:
    est = state.estimate
    lines = [info.name, f"state: {state.status.value.replace('_', ' ')}"]
    if latest is not None:
        lines.append(f"latest: {latest.outcome.value} ({_short_run(latest.run_id)})")
    lines.append(
        f"hangs {state.hangs} in {state.exposure_s / 3600:.1f} h; MTTF {_mttf_text(est.mttf_s, est.low_s, est.high_s)}"
    )
    if state.signatures:
        lines.append("signatures: " + ", ".join(state.signatures))
    return "\n".join(lines)


def _mttf_text(mttf: float | None, low: float, high: float | None) -> str:
    if mttf is None:
        return f"≥ {format_duration(low)} (95%)" if low > 0 else "–"
    return f"{format_duration(mttf)} ({format_duration(low)} – {format_duration(high) if high else '∞'})"


def _esc_plotly(text: str) -> str:
    """Plotly reads <br>, <b>, <a> and entities in text: escape, then put our own line breaks back."""
    return html.escape(str(text), quote=False).replace("\n", "<br>").replace("&lt;br&gt;", "<br>")


def flags_text(flags: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={format_value(v)}" for k, v in sorted(flags.items()))


def _dur(seconds: Any) -> str:
    try:
        return format_duration(float(seconds)) if seconds is not None else ""
    except (TypeError, ValueError):
        return str(seconds)


def when_text(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M UTC")


def _short_run(run_id: str) -> str:
    """`20261121T225500Z-3fa9c1` -> `11-21 22:55 3fa9`: readable on an axis, still unique enough."""
    head, _, tail = run_id.partition("-")
    if len(head) == 16 and head[8] == "T":
        return f"{head[4:6]}-{head[6:8]} {head[9:11]}:{head[11:13]} {tail[:4]}"
    return run_id
