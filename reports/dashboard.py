"""The dashboard: one self-contained static page (index.html) built from a history store.

Sections: the matrix heatmap (rows model x GPU, columns flag combinations, coloured by outcome and
MTTF), cells that need a look with their status history across nights, hang signatures with the
cells they hit and their stuck frames, findings (one per fingerprint, each with its own page of
culprit frames per role), bisection results as their tables, and per-run summaries;
`dashboard_data` (the tables) and `dashboard_figures` (the figures) assemble them as plain data, this
module renders and writes the page.

Self-contained: plotly's JS is inlined once (`plotly.offline.get_plotlyjs()`), figures travel as
JSON in `<script type="application/json">` blocks, no file or host is fetched, so the page opens
from a CI artifact or a laptop offline. Log lines are untrusted input: jinja2 autoescapes every
string into HTML, and the JSON blocks have `<`, `>` and `&` as \\u escapes so no string can close
its script element; strings plotly renders are HTML-escaped too (in `dashboard_figures`), as plotly
reads a few tags.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from soakmatrix.matrix.contracts.durations import format_duration

from .dashboard_data import (
    LINE_CHARS,
    MAX_FINDING_PAGES,
    DashboardData,
    attention_rows,
    bisection_rows,
    collect,
    finding_rows,
    flags_text,
    latest_run_view,
    overview,
    run_rows,
    signature_rows,
    when_text,
)
from .dashboard_figures import COLOURS, figures
from .files import write_atomic
from .findings import role_sections
from .history import HistoryStore
from .regressions import DEFAULT_CONFIDENCE, Regression, find_regressions, rows_of

TEMPLATES = Path(__file__).parent / "templates"


def build_dashboard(
    store_path: str | os.PathLike, out_dir: str | os.PathLike, known_issues: Sequence[Any] = ()
) -> Path:
    """Write `out_dir/index.html` and a page per finding (`out_dir/findings/<fingerprint>.html`) from
    the store; returns the index's path."""
    now = datetime.now(UTC).timestamp()
    with HistoryStore(store_path, create=False) as store:
        data = collect(store, now, known_issues)
        regressions = find_regressions(rows_of(store))
    page = with_regressions(render(data), regressions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for finding in data.findings[:MAX_FINDING_PAGES]:
        _write_atomic(out / "findings" / f"{finding.fingerprint}.html", render_finding(data, finding))
    return _write_atomic(out / "index.html", page)


# -- the page ---------------------------------------------------------------------------------------


def render(data: DashboardData) -> str:
    from plotly.offline import get_plotlyjs

    template = _env().get_template("index.html")
    return template.render(
        store=data.store,
        generated=when_text(data.generated_at),
        style=Markup((TEMPLATES / "style.css").read_text()),
        plotly_js=Markup(get_plotlyjs()),
        app_js=Markup((TEMPLATES / "dashboard.js").read_text()),
        figures={name: script_json(fig) for name, fig in figures(data).items()},
        summary=overview(data),
        attention=attention_rows(data),
        signatures=signature_rows(data),
        bisections=bisection_rows(data),
        runs=run_rows(data),
        latest=latest_run_view(data),
        findings=finding_rows(data),
        colours=COLOURS,
    )


def render_finding(data: DashboardData, finding: Any) -> str:
    """The finding's own page: when and where it appeared, pooled MTTF, the culprit frames per role."""
    env = _env()
    est = finding.estimate
    mttf = est.describe(format_duration) if est.hangs else ""
    return env.get_template("finding.html").render(
        f=finding,
        store=data.store,
        style=Markup((TEMPLATES / "style.css").read_text()),
        mttf=mttf,
        roles=role_sections(finding.example),
        log=[line[:LINE_CHARS] for line in finding.example.log_tail[-40:]],
    )


def amount_text(x: float) -> str:
    """A headline number: whole from 10 on, else two significant digits, so that a smoke run's 0.14
    GPU-hours does not read 0 beside its hours under load."""
    if x == 0:
        return "0"
    if abs(x) >= 10:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.1f}"
    return "<0.01" if abs(x) < 0.01 else f"{x:.2g}"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = lambda s: "" if s is None else format_duration(s)
    env.filters["when"] = when_text
    env.filters["flags"] = flags_text
    env.filters["amount"] = amount_text
    return env


def script_json(value: Any) -> Markup:
    """JSON safe inside <script type="application/json">: no `<`, `>` or `&` can end the element."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _write_atomic(path: Path, text: str) -> Path:
    return write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))


def with_regressions(page: str, regressions: list[Regression]) -> str:
    """The page with a section of regression findings between builds (reports/regressions.py) at the
    end of <main>; unchanged when there are none (a matrix without builds has none)."""
    if not regressions:
        return page
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = lambda s: "" if s is None else format_duration(s)
    section = env.get_template("regressions.html").render(
        regressions=regressions, confidence=f"{DEFAULT_CONFIDENCE:.0%}"
    )
    head, sep, tail = page.rpartition("</main>")
    return f"{head}{section}\n{sep}{tail}" if sep else page + section
