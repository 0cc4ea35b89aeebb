"""JUnit XML for a build bisection: one test case per hang signature it answered (xunit2, junitparser,
written whole or not at all like a run's JUnit, reports/junit.py).

The input is the answer's JSON document (`matrix.build_bisect.report.to_json`, the one `--json`
prints and the store records), so a stored bisection can be written again. Mapping of a signature's
verdict:

- regression   -> `<failure type="regression:<signature>" message="first bad build B (last good A), posterior p">`
- rate_change  -> `<failure type="rate_change:<signature>" message="rate change at B: MTTF before at least X, after Y, posterior p">`
- old          -> a bare (passed) case: the hang was already there at the last-good end, no build of
                  the list brought it in
- undecided    -> `<error type="undecided">`: no answer reached the stated confidence (no verdict)
- not_reproduced -> `<skipped>`: the named signature never hung

With no signature answered (the bad build did not hang, could not be installed, the budget ran out
before a hang) the bisection's own status is the one case. The case's name is the signature, its
classname `soakmatrix.build_bisect.<cell>`; properties carry the verdict, the builds, the posterior,
the MTTFs (seconds) and the hang counts; the suite's properties the bisection's status, confidence,
probes and GPU-hours. system-out holds the signature's answer in words and the notes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from junitparser import Error, Failure, Skipped, xunit2

from soakmatrix.matrix.contracts.durations import format_duration

from .junit import CLASSNAME_PREFIX, _write_atomic, name_safe, xml_safe

SUITE_NAME = "soakmatrix.build_bisect"
FAILING = ("regression", "rate_change")


def _dur(seconds: Any) -> str:
    return "-" if not isinstance(seconds, (int, float)) else format_duration(float(seconds))


def _last_good(doc: Mapping[str, Any], first_bad: str | None) -> str | None:
    builds = [b.get("build") for b in doc.get("builds") or [] if isinstance(b, Mapping)]
    if first_bad in builds and builds.index(first_bad) > 0:
        return builds[builds.index(first_bad) - 1]
    return None


def answer_text(doc: Mapping[str, Any], sig: Mapping[str, Any]) -> str:
    """One signature's answer in words, e.g. "rate change at b7: MTTF before at least 4 h, after 30 m,
    posterior 0.996"."""
    verdict, first = sig.get("verdict"), sig.get("first_bad")
    post = f"posterior {sig.get('posterior', 0.0):.3f} (stated {doc.get('confidence', 0.0):.0%})"
    if verdict == "regression":
        last = _last_good(doc, first)
        return f"first bad build {first}" + (f" (last good {last})" if last else "") + f", {post}"
    if verdict == "rate_change":
        before = sig.get("mttf_before_low_s")
        return (
            f"rate change at {first}: "
            + (f"MTTF before at least {_dur(before)}, " if before else "")
            + f"after {_dur(sig.get('mttf_after_s'))}, {post}"
        )
    if verdict == "old":
        good = (doc.get("builds") or [{}])[0].get("build", "the good build")
        return f"old: present at the last-good end ({good}), {post}"
    if verdict == "undecided":
        rng = sig.get("range") or []
        at = "" if not rng else rng[0] + (f"..{rng[1]}" if rng[1] != rng[0] else "")
        return f"undecided: likeliest change point {at} at {sig.get('posterior', 0.0):.3f}"
    return "not reproduced: it never hung"


def signature_case(doc: Mapping[str, Any], sig: Mapping[str, Any]) -> xunit2.TestCase:
    name = str(sig.get("signature") or "unknown")
    case = xunit2.TestCase(xml_safe(name), classname=_classname(doc))
    props = {
        "verdict": sig.get("verdict"),
        "target": str(bool(sig.get("target"))).lower(),
        "crash": str(bool(sig.get("crash"))).lower(),
        "first_bad": sig.get("first_bad"),
        "last_good": _last_good(doc, sig.get("first_bad")) if sig.get("first_bad") else None,
        "posterior": sig.get("posterior"),
        "confidence": doc.get("confidence"),
        "mttf_after_s": sig.get("mttf_after_s"),
        "mttf_before_low_s": sig.get("mttf_before_low_s"),
        "hangs": sig.get("hangs"),
        "hangs_on_bad_build": sig.get("hangs_on_bad_build"),
        "hangs_before": sig.get("hangs_before"),
    }
    rng = sig.get("range")
    if rng:
        props["range"] = f"{rng[0]}..{rng[1]}"
    for key, value in props.items():
        if value is not None:
            case.add_property(key, xml_safe(value))
    text = answer_text(doc, sig)
    verdict = sig.get("verdict")
    if verdict in FAILING:
        case.result = [Failure(xml_safe(text), f"{verdict}:{xml_safe(name)}")]
    elif verdict == "undecided":
        case.result = [Error(xml_safe(text), "undecided")]
    elif verdict not in ("old",):
        case.result = [Skipped(xml_safe(text))]
    case.system_out = xml_safe("\n".join([f"{name}: {text}", *(f"note: {n}" for n in doc.get("notes") or [])]))
    return case


def status_case(doc: Mapping[str, Any]) -> xunit2.TestCase:
    """The one case of a bisection that answered no signature: its status, as an error (no verdict) or
    skipped (not reproduced)."""
    status = str(doc.get("status") or "unknown")
    case = xunit2.TestCase(xml_safe(doc.get("signature") or "build-bisection"), classname=_classname(doc))
    case.add_property("status", xml_safe(status))
    notes = "; ".join(map(str, doc.get("notes") or [])) or status
    case.result = (
        [Skipped(xml_safe(notes))] if status == "not_reproduced" else [Error(xml_safe(notes), xml_safe(status))]
    )
    return case


def _classname(doc: Mapping[str, Any]) -> str:
    cell = doc.get("cell")
    cell_id = cell.get("id") if isinstance(cell, Mapping) else cell
    return f"{CLASSNAME_PREFIX}.build_bisect" + (f".{name_safe(str(cell_id))}" if cell_id else "")


def build_bisection_suite(doc: Mapping[str, Any]) -> xunit2.TestSuite:
    """The suite: one case per signature answered (the target first), else one for the status."""
    suite = xunit2.TestSuite(SUITE_NAME)
    builds = [b.get("build") for b in doc.get("builds") or [] if isinstance(b, Mapping)]
    for key, value in (
        ("status", doc.get("status")),
        ("signature", doc.get("signature")),
        ("confidence", doc.get("confidence")),
        ("posterior", doc.get("posterior")),
        ("builds", f"{builds[0]}..{builds[-1]} ({len(builds)})" if builds else None),
        ("probes", doc.get("probes")),
        ("gpu_hours", doc.get("gpu_hours")),
    ):
        if value is not None:
            suite.add_property(key, xml_safe(value))
    sigs = [s for s in doc.get("signatures") or [] if isinstance(s, Mapping)]
    suite.add_testcases([signature_case(doc, s) for s in sigs] or [status_case(doc)])
    return suite


def write_build_bisection_junit(doc: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write the bisection's JUnit to `path`, whole or not at all (an OSError when it cannot be)."""
    xml = xunit2.JUnitXml(SUITE_NAME)
    xml.add_testsuite(build_bisection_suite(doc))
    xml.update_statistics()
    return _write_atomic(xml, Path(path))
