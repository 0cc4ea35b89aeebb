"""Bisection results as a text table (like seed 002's MTTF table) and as JSON for scripts."""

from __future__ import annotations

import math
from typing import Any

from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.flags import format_value

from .model import BisectResult


def _dur(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and (math.isnan(seconds))):
        return "-"
    if math.isinf(seconds):
        return "inf"
    return format_duration(seconds)


def mttf_text(hangs: int, exposure_s: float, confidence: float) -> str:
    """`38m (95% CI 21m-1h12m)` after hangs; `> 2h at 95%` without one; never "never"."""
    from soakmatrix.matrix.contracts import stats

    if exposure_s <= 0:
        return "-"
    est = stats.mttf_estimate(hangs, exposure_s, confidence)
    return est.describe(_dur)


def render_text(r: BisectResult) -> str:
    c = r.confidence
    out = [
        f"bisect: {r.status}"
        + (f", signature {r.signature}" if r.signature else "")
        + (f" (from {r.signature_source})" if r.signature and r.signature_source else "")
    ]
    if r.failing is not None:
        out.append(
            f"failing cell: MTTF {r.failing.describe(_dur)} from {r.failing.hangs} hang(s) "
            f"in {_dur(r.failing.exposure_s)}; cap {_dur(r.mttf_cap_s)}"
        )
    out.append("")
    header = f"{'config':<48} {'role':<13} {'probes':>6} {'hangs':>5} {'exposure':>9}  MTTF"
    out += [header, "-" * len(header)]
    for cs in sorted(
        r.configs, key=lambda x: (x.role != "calibration", x.role == "shrink", -bin(max(x.mask, 0)).count("1"))
    ):
        hangs = f"{cs.hangs}" + (f"+{cs.other_hangs}*" if cs.other_hangs else "")
        label = cs.label if len(cs.label) <= 48 else cs.label[:45] + "..."
        out.append(
            f"{label:<48} {cs.role:<13} {cs.probes:>6} {hangs:>5} {_dur(cs.exposure_s):>9}  "
            f"{mttf_text(cs.hangs, cs.exposure_s, c)}"
        )
    if any(cs.other_hangs for cs in r.configs):
        out.append(
            "  * hangs or crashes of another signature: they restarted the server (the probe went on) but do not count"
        )
    if r.other_signatures:
        out.append(
            "other signatures (restarted probes, not counted): "
            + ", ".join(f"{sig} x{n}" for sig, n in r.other_signatures.items())
        )
    out += ["", "verdicts:"]
    for v in r.verdicts:
        e = v.element
        # a shrunk flag is shown at the value the answer stands on (TP 4 -> 2 still hangs: 1 -> 2)
        value = r.shrunk[e.name]["to"] if e.name in r.shrunk else e.value
        text = v.text + (f" (shrunk from {format_value(e.value)})" if e.name in r.shrunk else "")
        out.append(f"  {e.name:<22} {format_value(e.baseline):>18} -> {format_value(value):<18} {text}")
    if r.values:
        out += ["", "values of the minimal set's flags (toward the baseline):"]
        for vp in r.values:
            out.append(f"  {vp.flag}={format_value(vp.value)}: {vp.verdict}")
    out.append("")
    if r.status == "found":
        flags = (
            ", ".join(f"{n}={format_value(r.minimal_flags.get(n))}" for n in r.minimal)
            or "(none: the baseline itself hangs)"
        )
        out.append(f"minimal set: {flags}   (stated confidence {c:g}; {_posterior_reading(r)})")
        if r.minimal_mttf is not None:
            out.append(f"minimal set MTTF (pooled over configs containing it): {r.minimal_mttf.describe(_dur)}")
        if r.certified_soak_s:
            out.append(f"certified soak: {_dur(r.certified_soak_s)} sees it hang with probability >= {c:g}")
    if r.context:
        out.append("context (cannot move): " + ", ".join(f"{k} ({why})" for k, why in r.context.items()))
    for note in r.notes:
        out.append(f"note: {note}")
    spent = ", ".join(
        f"{role} {hours:.2f}" for role, hours in sorted(r.gpu_hours_by_role.items(), key=lambda kv: -kv[1])
    )
    out.append(f"probes: {r.probes}, GPU-hours: {r.gpu_hours:.2f}" + (f" ({spent})" if spent else ""))
    return "\n".join(out) + "\n"


def _num(x: float | None) -> float | None:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return None
    return round(float(x), 3)


def _posterior_reading(r: BisectResult) -> str:
    """The search model's posterior, said so that a low one after a rate check is not misread: that
    model holds one rate for every config with the set, which a flag that changes the rate breaks;
    the answer stands on the tests that decided it, each at its share of the stated confidence."""
    if r.posterior >= r.confidence:
        return f"posterior under the one-rate search model {r.posterior:.4f}"
    if r.rate_added:
        return (
            f"the one-rate search model's posterior, {r.posterior:.4f}, does not apply: the rate check "
            f"found that {', '.join(r.rate_added)} changes the rate"
        )
    return (
        f"the one-rate search model's posterior is {r.posterior:.4f}; the set was decided by the "
        f"ablation's tests, each at its share of the stated confidence"
    )


def to_json(r: BisectResult) -> dict[str, Any]:
    def est(e):
        if e is None:
            return None
        return {
            "hangs": e.hangs,
            "exposure_s": _num(e.exposure_s),
            "mttf_s": _num(e.point_s),
            "low_s": _num(e.low_s),
            "high_s": _num(e.high_s),
            "confidence": e.confidence,
        }

    return {
        "status": r.status,
        "signature": r.signature,
        "signature_source": r.signature_source,
        "other_signatures": r.other_signatures,
        "confidence": r.confidence,
        "posterior": _num(r.posterior),
        "mttf_cap_s": _num(r.mttf_cap_s),
        "failing": est(r.failing),
        "minimal": r.minimal,
        "minimal_flags": r.minimal_flags,
        "minimal_mttf": est(r.minimal_mttf),
        "certified_soak_s": _num(r.certified_soak_s),
        "elements": [{"flag": e.name, "baseline": e.baseline, "failing": e.value} for e in r.elements],
        "context": r.context,
        "verdicts": [
            {
                "flag": v.element.name,
                "kind": v.kind,
                "text": v.text,
                "ratio": _num(v.ratio),
                "ratio_low": _num(v.ratio_low),
                "ratio_high": _num(v.ratio_high),
                "p_value": _num(v.p_value),
            }
            for v in r.verdicts
        ],
        "configs": [
            {
                "label": cs.label,
                "role": cs.role,
                "flags": cs.flags,
                "probes": cs.probes,
                "hangs": cs.hangs,
                "other_hangs": cs.other_hangs,
                "exposure_s": _num(cs.exposure_s),
                "gpu_hours": _num(cs.gpu_hours),
                "mttf": mttf_text(cs.hangs, cs.exposure_s, r.confidence),
            }
            for cs in r.configs
        ],
        "values": [
            {"flag": v.flag, "value": v.value, "hangs": v.hangs, "exposure_s": _num(v.exposure_s), "verdict": v.verdict}
            for v in r.values
        ],
        "probes": r.probes,
        "gpu_hours": _num(r.gpu_hours),
        "gpu_hours_by_role": {role: _num(hours) for role, hours in r.gpu_hours_by_role.items()},
        "rate_added": r.rate_added,
        "shrunk": r.shrunk,
        "notes": r.notes,
    }
