"""The build bisection's answer for people (`render_text`) and for machines (`to_json`): the
headline (the target signature's answer), then one line (text) or one object (JSON `signatures`)
per signature seen: old, a regression, a rate change, undecided or not reproduced."""

from __future__ import annotations

import math
from typing import Any

from soakmatrix.matrix.contracts.durations import format_duration

from .result import FOUND, NOT_A_REGRESSION, RANGE, RATE_CHANGE, BuildBisectResult
from .signatures import OLD, REGRESSION, UNDECIDED, SignatureAnswer
from .signatures import RATE_CHANGE as RATE_CHANGE_VERDICT

HEADLINES = {
    "inconclusive": "inconclusive: the budget ran out before any build reached the stated confidence",
    "not_reproduced": "not reproduced: the bad build did not hang",
    "bad_build_untestable": "the bad build could not be installed or started",
}


def _hours(seconds: float) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else format_duration(seconds)


def headline(r: BuildBisectResult) -> str:
    pct = f"{r.posterior:.3f} (stated {r.confidence:.0%})"
    if r.status == FOUND:
        last_good = "" if r.last_good is None else f", last good {r.builds[r.last_good]}"
        return f"first bad build: {r.first_bad_build}{last_good}, posterior {pct}"
    if r.status == RATE_CHANGE and r.first_bad is not None:
        before = "" if r.mttf_before_low_s is None else f"MTTF before at least {_hours(r.mttf_before_low_s)}, "
        return f"rate change at {r.first_bad_build}: {before}after {_hours(r.mttf_s)}, posterior {pct}"
    if r.status == RANGE and r.range:
        lo, hi = r.range
        return (
            f"the first bad build is one of {r.builds[lo]}..{r.builds[hi]} (untestable builds between), posterior {pct}"
        )
    if r.status == NOT_A_REGRESSION:
        return f"not a regression: the good build {r.builds[0]} hangs with {r.signature} too, posterior {pct}"
    return HEADLINES.get(r.status, r.status)


def render_text(r: BuildBisectResult, history: str | None = None) -> str:
    """`history`: one line on the evidence the history store gave (`--store`), shown under the signature."""
    lines = [headline(r), f"signature: {r.signature or '-'}"]
    if history:
        lines.append(f"from history: {history}")
    if r.target_hangs:
        lines.append(
            f"MTTF on the bad builds: {_hours(r.mttf_s)} ({r.confidence:.0%} CI {_hours(r.mttf_low_s)}-"
            f"{_hours(r.mttf_high_s)}, {r.target_hangs} hangs)"
        )
    if r.good_mttf_bound_s is not None and r.last_good is not None:
        lines.append(
            f"last good build {r.builds[r.last_good]}: MTTF > {_hours(r.good_mttf_bound_s)} at {r.confidence:.0%}"
        )
    if r.alternatives:
        lines.append(
            "next likeliest: "
            + ", ".join(
                f"{r.builds[a]}" + (f"..{r.builds[b]}" if b > a else "") + f" {p:.4f}" for a, b, p in r.alternatives
            )
        )
    lines.append("")
    lines.append(f"{'build':<24} {'probes':>6} {'hangs':>6} {'other':>6} {'exposure':>10} {'GPU-h':>7}  verdict")
    for i, (name, b) in enumerate(zip(r.builds, r.evidence, strict=True)):
        if not b.probes and not b.exposure_s and not b.hangs and i not in (0, len(r.builds) - 1):
            continue
        if b.is_untestable:
            verdict = "untestable"
        elif b.hangs and r.status == RATE_CHANGE and r.first_bad is not None and i < r.first_bad:
            verdict = "old rate"
        elif b.hangs:
            verdict = "bad"
        elif b.probes:
            verdict = "passed"
        elif b.exposure_s:
            verdict = "passed (history)"
        else:
            verdict = "not probed"
        lines.append(
            f"{name[:24]:<24} {b.probes:>6} {b.hangs:>6} {b.other_hangs:>6} {_hours(b.exposure_s):>10} "
            f"{b.gpu_hours:>7.2f}  {verdict}"
        )
    if r.signatures:
        lines.append("")
        lines.append("signatures (each on its own, from the same probes):")
        lines.extend(f"  {signature_line(r, a)}" for a in r.signatures)
    lines.extend(f"note: {n}" for n in r.notes)
    roles = ", ".join(f"{k} {v:.1f}" for k, v in r.gpu_hours_by_role.items())
    rounds = f" in {r.rounds} rounds" if 0 < r.rounds < r.probes else ""
    lines.append(f"{r.probes} probes{rounds}, {r.gpu_hours:.1f} GPU-hours" + (f" ({roles})" if roles else ""))
    return "\n".join(lines) + "\n"


def signature_line(r: BuildBisectResult, a: SignatureAnswer) -> str:
    """One signature's answer in words, e.g. "nccl_watchdog_timeout: old (hangs on the good build b0 too)"."""
    name = a.signature + (" (target)" if a.target else "") + (" (crash)" if a.crash else "")
    at = ""
    if a.first is not None and a.last is not None:
        at = r.builds[a.first] + (f"..{r.builds[a.last]}" if a.last != a.first else "")
    counts = f"{a.hangs} hang(s), {a.hangs_on_bad_build} on the bad build"
    if a.verdict == OLD:
        return f"{name}: old, present at the last-good end {r.builds[0]}, posterior {a.posterior:.3f}; {counts}"
    if a.verdict == REGRESSION:
        return f"{name}: regression, first bad build {at}, posterior {a.posterior:.3f}; {counts}"
    if a.verdict == RATE_CHANGE_VERDICT:
        before = "" if a.mttf_before_low_s is None else f"MTTF before at least {_hours(a.mttf_before_low_s)}, "
        return (
            f"{name}: rate change at {at}: {before}after {_hours(a.mttf_after_s)}, posterior {a.posterior:.3f}; "
            f"{counts}, {a.hangs_before} before"
        )
    if a.verdict == UNDECIDED:
        return f"{name}: undecided, likeliest change point {at} at {a.posterior:.3f}; {counts}"
    return f"{name}: not reproduced"


def signature_json(r: BuildBisectResult, a: SignatureAnswer) -> dict[str, Any]:
    """One signature's answer with named fields (JSON `signatures`, the store, JUnit)."""
    return {
        "signature": a.signature,
        "verdict": a.verdict,
        "target": a.target,
        "crash": a.crash,
        "first_bad": r.builds[a.first]
        if a.first is not None and a.verdict in (REGRESSION, RATE_CHANGE_VERDICT)
        else None,
        "range": None if a.first is None or a.last is None else [r.builds[a.first], r.builds[a.last]],
        "posterior": round(a.posterior, 6),
        "hangs": a.hangs,
        "hangs_on_bad_build": a.hangs_on_bad_build,
        "hangs_before": a.hangs_before,
        "mttf_after_s": _num(a.mttf_after_s),
        "mttf_before_low_s": _num(a.mttf_before_low_s),
    }


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 3)


def to_json(r: BuildBisectResult, history: dict[str, Any] | None = None) -> dict[str, Any]:
    """`history`: the evidence the history store gave (`--store`), under "history" when given."""
    doc = {
        "status": r.status,
        "signature": r.signature,
        "confidence": r.confidence,
        "posterior": round(r.posterior, 6),
        "first_bad": r.first_bad_build,
        "first_bad_index": r.first_bad,
        "range": None if r.range is None else [r.builds[r.range[0]], r.builds[r.range[1]]],
        "last_good": None if r.last_good is None else r.builds[r.last_good],
        "untestable": [r.builds[i] for i in r.untestable],
        "alternatives": [
            {"first": r.builds[a], "last": r.builds[b], "posterior": round(p, 6)} for a, b, p in r.alternatives
        ],
        "mttf": {
            "hangs": r.target_hangs,
            "mttf_s": _num(r.mttf_s),
            "low_s": _num(r.mttf_low_s),
            "high_s": _num(r.mttf_high_s),
        },
        "good_mttf_bound_s": _num(r.good_mttf_bound_s),
        "mttf_before_low_s": _num(r.mttf_before_low_s),
        "signatures": [signature_json(r, a) for a in r.signatures],
        "builds": [
            {
                "build": name,
                "probes": b.probes,
                "hangs": b.hangs,
                "other_hangs": b.other_hangs,
                "exposure_s": round(b.exposure_s, 3),
                "gpu_hours": round(b.gpu_hours, 4),
                "untestable": b.is_untestable,
            }
            for name, b in zip(r.builds, r.evidence, strict=True)
        ],
        "probes": r.probes,
        "rounds": r.rounds,
        "gpu_hours": round(r.gpu_hours, 4),
        "gpu_hours_by_role": {k: round(v, 4) for k, v in r.gpu_hours_by_role.items()},
        "notes": list(r.notes),
    }
    if history is not None:
        doc["history"] = history
    return doc
