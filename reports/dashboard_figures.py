"""The dashboard's plotly figures, as plain data from `DashboardData`: the matrix heatmap (a cell
coloured by its state, a hang by its MTTF), the status history of the worst cells over the runs, and
the outcomes per run. The tables' rows are `dashboard_data`'s.

Strings plotly renders are HTML-escaped here (`_esc_plotly`), as plotly reads a few tags and log
lines are untrusted.
"""

from __future__ import annotations

import html
import math
from collections import Counter, defaultdict

from soakmatrix.matrix.contracts.outcomes import Outcome

from .dashboard_data import (
    MAX_HISTORY_ROWS,
    OUTCOME_ORDER,
    DashboardData,
    attention_key,
    flags_text,
    mttf_text,
    short_run,
)
from .history import CellInfo, RecordedResult
from .state import CellState, CellStatus

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
    picked = sorted((s for s in data.states.values() if s.status is not CellStatus.PASSING), key=attention_key)[
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
                "x": [short_run(r) for r in run_ids],
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
    x = [short_run(r.id) for r in data.runs]
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


def _cell_hover(info: CellInfo, state: CellState, latest: RecordedResult | None) -> str:
    est = state.estimate
    lines = [info.name, f"state: {state.status.value.replace('_', ' ')}"]
    if latest is not None:
        lines.append(f"latest: {latest.outcome.value} ({short_run(latest.run_id)})")
    lines.append(
        f"hangs {state.hangs} in {state.exposure_s / 3600:.1f} h; MTTF {mttf_text(est.mttf_s, est.low_s, est.high_s)}"
    )
    if state.signatures:
        lines.append("signatures: " + ", ".join(state.signatures))
    return "\n".join(lines)


def _esc_plotly(text: str) -> str:
    """Plotly reads <br>, <b>, <a> and entities in text: escape, then put our own line breaks back."""
    return html.escape(str(text), quote=False).replace("\n", "<br>").replace("&lt;br&gt;", "<br>")
