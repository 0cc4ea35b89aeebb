"""Text tables for terminals: runs, cells that need a look, hang signatures, findings, bisections.

Plain aligned columns (no box drawing), so the output pastes cleanly into issues and CI logs.
Each function takes the same data the dashboard shows and returns a string ending in a newline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.flags import format_value
from soakmatrix.matrix.contracts.outcomes import Outcome

from .history import CellInfo, RecordedResult, Run
from .state import CellState, CellStatus, SignatureSummary

MAX_CELL_CHARS = 90


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()) -> str:
    """Columns padded to their widest entry; column indexes in `right` are right-aligned (numbers)."""
    rows = [["" if v is None else str(v) for v in row] for row in rows]
    right = set(right)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        cells = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "  ".join(cells).rstrip()

    out = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return "\n".join(out) + "\n"


def runs_table(runs: Sequence[Run], observations: Iterable[RecordedResult]) -> str:
    counts: dict[str, Counter] = {r.id: Counter() for r in runs}
    hours: dict[str, float] = {r.id: 0.0 for r in runs}
    for ob in observations:
        if ob.run_id in counts:
            counts[ob.run_id][ob.outcome] += 1
            hours[ob.run_id] += ob.exposure_s / 3600.0
    order = [Outcome.PASSED, Outcome.HANG, Outcome.CRASH, Outcome.CONFIG_ERROR, Outcome.INFRA_ERROR]
    rows = [
        [
            r.id,
            r.kind,
            f"{r.matrix}:{r.profile}",
            r.status or "unfinished",
            r.planned,
            *[counts[r.id][o] for o in order],
            f"{hours[r.id]:.1f}",
        ]
        for r in runs
    ]
    return format_table(
        ["run", "kind", "matrix:profile", "status", "planned", "passed", "hang", "crash", "config", "infra", "hours"],
        rows,
        right=range(4, 11),
    )


def attention_table(states: Mapping[str, CellState], cells: Mapping[str, CellInfo], limit: int = 50) -> str:
    picked = sorted(
        (s for s in states.values() if s.status is not CellStatus.PASSING),
        key=lambda s: (s.status.severity, -s.hangs, -s.failing_runs, s.cell_id),
    )
    if not picked:
        return "every cell passed every run it had a verdict in\n"
    rows = []
    for s in picked[:limit]:
        est = s.estimate
        rows.append(
            [
                s.status.value,
                s.cell_id,
                _cut(cells[s.cell_id].name if s.cell_id in cells else s.cell_id),
                history_strip(s),
                f"{s.failing_runs}/{s.verdict_runs}",
                s.hangs,
                format_duration(est.mttf_s) if est.mttf_s else "",
                s.first_failing_run or "",
                ",".join(s.signatures),
            ]
        )
    text = format_table(
        ["state", "cell id", "cell", "nights", "failed", "hangs", "MTTF", "first failed", "signatures"],
        rows,
        right=(4, 5, 6),
    )
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
        rows.append(
            [
                s.signature,
                s.outcome.value,
                s.hits,
                len(s.cells),
                f"{s.exposure_s / 3600:.1f}",
                format_duration(est.mttf_s) if est.mttf_s else "",
                ci,
                s.first_seen_run,
            ]
        )
    return format_table(
        ["signature", "outcome", "hits", "cells", "hours", "MTTF", "95% CI", "first seen"], rows, right=(2, 3, 4, 5)
    )


def findings_table(findings: Sequence[Any], frames: int = 3) -> str:
    """One row per bug (`reports.findings.Finding`), then the culprit and its top frames for each."""
    if not findings:
        return "no fingerprinted hang or crash recorded\n"
    rows = []
    for f in findings:
        est = f.estimate
        mttf = format_duration(est.point_s) if est.hangs and est.point_s != float("inf") else ""
        ci = (
            f"{format_duration(est.low_s)}-{format_duration(est.high_s)}" if mttf and est.high_s != float("inf") else ""
        )
        issue = f.known_issue.id if f.known_issue else "new"
        gpu = ",".join(f"{k} x{v}" for k, v in sorted(f.gpu.items())) or "-"
        rows.append([f.fingerprint, f.signature or "unknown", f.hits, len(f.cells), f.nights, mttf, ci, gpu, issue])
    out = format_table(
        ["fingerprint", "signature", "hits", "cells", "nights", "MTTF", "95% CI", "gpu", "known issue"],
        rows,
        right=(2, 3, 4),
    )
    for f in findings:
        out += f"\n{f.fingerprint}: {_cut(f.example.culprit or 'no culprit thread (stacks unreachable)')}\n"
        out += "".join(f"    {_cut(line)}\n" for line in f.culprit_frames[:frames])
        if f.known_issue:
            k = f.known_issue
            out += f"    known issue [{k.status}] {_cut(k.title)} {k.url}\n"
            if k.workaround:
                out += f"    workaround: {_cut(k.workaround)}\n"
    return out


def bisection_view(report: Mapping[str, Any]) -> dict[str, Any]:
    """One stored bisection report in one shape, whichever spelling wrote it: the store's contract
    (`minimal_set`, `verdicts` as flag -> text, config rows with `mttf_s` and `ci`) or
    `matrix.bisect.report.to_json` (`minimal`/`minimal_flags`, `verdicts` as a list of
    {flag, kind, text}, config rows with `label`, `role`, `probes` and an `mttf` text, `cell` as {id, name})."""
    cell = report.get("cell")
    cell_id = report.get("cell_id") or (cell.get("id") if isinstance(cell, Mapping) else cell)
    cell_name = cell.get("name") if isinstance(cell, Mapping) else None
    if report.get("kind") == "builds":
        return _build_bisection_view(report, cell_id, cell_name)
    minimal = report.get("minimal_set")
    names, flags = report.get("minimal"), report.get("minimal_flags")
    if minimal is None and isinstance(names, (list, tuple)) and isinstance(flags, Mapping):
        # to_json's minimal_flags is the whole minimal config (the baseline's values of every other
        # flag too); the set is the flags `minimal` names, at their values there
        minimal = {n: flags[n] for n in names if n in flags}
    if minimal is None:
        minimal = flags or names
    if isinstance(minimal, Mapping):
        minimal_text = ",".join(f"{k}={format_value(v)}" for k, v in sorted(minimal.items()))
    elif isinstance(minimal, (list, tuple)):
        minimal_text = ",".join(map(str, minimal))
    else:
        minimal_text = "" if minimal is None else str(minimal)
    if report.get("status") == "found" and not minimal_text:
        minimal_text = "(none: the baseline itself hangs)"
    verdicts = report.get("verdicts") or {}
    if isinstance(verdicts, Mapping):
        verdict_rows = [(str(k), str(v)) for k, v in sorted(verdicts.items())]
    else:
        verdict_rows = [
            (str(v.get("flag", "")), (f"{v['kind']}: " if v.get("kind") else "") + str(v.get("text", "")))
            for v in verdicts
            if isinstance(v, Mapping)
        ]
    configs = []
    for row in report.get("configs") or []:
        flags = row.get("flags") or {}
        ci = row.get("ci")
        if ci is None and ("low_s" in row or "high_s" in row):
            ci = [row.get("low_s"), row.get("high_s")]
        mttf = row.get("mttf_s")
        configs.append(
            {
                "label": row.get("label")
                or (
                    ",".join(f"{k}={format_value(v)}" for k, v in sorted(flags.items()))
                    if isinstance(flags, Mapping)
                    else str(flags)
                )
                or "(baseline)",
                "role": row.get("role") or "",
                "probes": row.get("probes", ""),
                "hangs": row.get("hangs", ""),
                "exposure": _dur(row.get("exposure_s")),
                "mttf": _dur(mttf) if mttf is not None else str(row.get("mttf") or ""),
                "ci": (
                    f"{_dur(ci[0]) or '0'} – {_dur(ci[1]) or '∞'}"
                    if isinstance(ci, (list, tuple)) and len(ci) == 2
                    else ""
                    if ci is None
                    else str(ci)
                ),
            }
        )
    return {
        "kind": "flags",
        "cell_id": cell_id,
        "cell_name": cell_name,
        "signature": report.get("signature") or "",
        "status": report.get("status") or "",
        "minimal": minimal_text,
        "confidence": report.get("confidence"),
        "posterior": report.get("posterior"),
        "gpu_hours": report.get("gpu_hours"),
        "certified_soak": _dur(report.get("certified_soak_s")),
        "configs": configs,
        "verdicts": verdict_rows,
        "run_id": report.get("run_id") or "",
        "recorded_at": report.get("recorded_at"),
    }


def _build_bisection_view(report: Mapping[str, Any], cell_id: Any, cell_name: Any) -> dict[str, Any]:
    """A build bisection's report (`matrix.build_bisect.report.to_json`, stored with kind "builds") in
    the same shape: the answer is the first bad build (or a range of untestable builds), the rows are
    the builds probed."""
    first_bad, last_good, rng = report.get("first_bad"), report.get("last_good"), report.get("range")
    if first_bad:
        answer = (
            ("rate change at " if report.get("status") == "rate_change" else "")
            + f"{first_bad}"
            + (f" (last good {last_good})" if last_good else "")
        )
    elif isinstance(rng, (list, tuple)) and len(rng) == 2:
        answer = f"one of {rng[0]}..{rng[1]}"
    else:
        answer = ""
    rows = []
    for b in report.get("builds") or []:
        if not isinstance(b, Mapping) or not b.get("probes"):
            continue
        verdict = "untestable" if b.get("untestable") else "bad" if b.get("hangs") else "passed"
        rows.append(
            {
                "label": str(b.get("build", "")),
                "role": verdict,
                "probes": b.get("probes", ""),
                "hangs": b.get("hangs", ""),
                "exposure": _dur(b.get("exposure_s")),
                "mttf": "",
                "ci": "",
            }
        )
    raw_mttf = report.get("mttf")
    mttf = raw_mttf if isinstance(raw_mttf, Mapping) else {}
    notes = [("MTTF on the bad builds", _dur(mttf.get("mttf_s")))] if mttf.get("mttf_s") else []
    if report.get("good_mttf_bound_s"):
        notes.append(("last good build", f"MTTF > {_dur(report.get('good_mttf_bound_s'))}"))
    if report.get("mttf_before_low_s"):
        notes.append(("before the rate change", f"MTTF >= {_dur(report.get('mttf_before_low_s'))}"))
    for sig in report.get("signatures") or []:
        if isinstance(sig, Mapping):
            notes.append(
                (
                    f"signature {sig.get('signature', '')}" + (" (target)" if sig.get("target") else ""),
                    _signature_text(sig),
                )
            )
    return {
        "kind": "builds",
        "cell_id": cell_id,
        "cell_name": cell_name,
        "signature": report.get("signature") or "",
        "status": report.get("status") or "",
        "minimal": answer,
        "confidence": report.get("confidence"),
        "posterior": report.get("posterior"),
        "gpu_hours": report.get("gpu_hours"),
        "certified_soak": "",
        "configs": rows,
        "verdicts": notes,
        "run_id": report.get("run_id") or "",
        "recorded_at": report.get("recorded_at"),
    }


def _signature_text(sig: Mapping[str, Any]) -> str:
    """One signature's answer of a build bisection (`report.signature_json`) in a few words."""
    verdict, where, p = sig.get("verdict", ""), sig.get("range") or [], sig.get("posterior")
    at = "" if not where else where[0] + (f"..{where[1]}" if len(where) == 2 and where[1] != where[0] else "")
    post = f", posterior {p:.3f}" if isinstance(p, (int, float)) else ""
    if verdict == "old":
        return f"old: hangs on the good build too{post}"
    if verdict == "regression":
        return f"regression: first bad build {at}{post}"
    if verdict == "rate_change":
        before = f"MTTF before >= {_dur(sig.get('mttf_before_low_s'))}, " if sig.get("mttf_before_low_s") else ""
        return f"rate change at {at}: {before}after {_dur(sig.get('mttf_after_s'))}{post}"
    if verdict == "undecided":
        return f"undecided: likeliest {at}{post}"
    return str(verdict)


def bisections_table(bisections: Sequence[Mapping[str, Any]]) -> str:
    if not bisections:
        return "no bisection recorded\n"
    rows = []
    for b in map(bisection_view, bisections):
        rows.append(
            [b["cell_id"], b["signature"], b["status"], b["minimal"], b["confidence"] or "", b["gpu_hours"] or ""]
        )
    return format_table(
        ["cell", "signature", "status", "smallest hanging set", "confidence", "GPU-h"], rows, right=(4, 5)
    )


STRIP = {
    Outcome.PASSED: ".",
    Outcome.HANG: "H",
    Outcome.CRASH: "C",
    Outcome.CONFIG_ERROR: "X",
    Outcome.INFRA_ERROR: "i",
    None: " ",
}


def history_strip(state: CellState) -> str:
    """One character per run: `.` passed, H hang, C crash, X config error, i infra error, blank not run."""
    return "".join(STRIP[o] for _, o in state.history)


def _dur(seconds: Any) -> str:
    if seconds is None:
        return ""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    return "" if value != value or value in (float("inf"), float("-inf")) else format_duration(value)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 3] + "..."
