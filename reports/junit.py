"""JUnit XML for CI dashboards: one test case per cell, written and merged with junitparser (xunit2).

The xunit2 flavour (Jenkins xunit plugin's junit-10.xsd, what pytest writes) is the one that knows
test-case `<properties>`, `<rerunFailure>` and `<flakyFailure>`. Mapping of outcomes:

- passed        -> a bare test case
- hang          -> `<failure type="hang:<signature>" message="what stopped and when">`
- crash         -> `<failure type="crash:<signature>">`
- config_error  -> `<error type="config_error">` (the engine refused the flags: no verdict on hangs)
- infra_error   -> `<error type="infra_error">` (node lost, port taken, ...: never a hang)
- earlier infra errors that were retried -> one `<flakyFailure>` each when the cell finally passed,
  `<rerunFailure>` each otherwise (Surefire's meaning: flaky = passed on a rerun)

Names are the cell names (unique without properties, as GitLab and Buildkite need); the classname
is `soakmatrix.<model>.<gpu>` so Jenkins groups cells by model and GPU type. Every string goes
through `xml_safe`: log lines carry ANSI escapes and other characters XML 1.0 cannot hold.

What every consumer takes: system-out holds bounded excerpts (the culprit per role first, then the
log tail; at most `MAX_SYSTEM_OUT_CHARS`) and links the evidence files as `[[ATTACHMENT|path]]`
lines (Jenkins' junit-attachments plugin and GitLab read them); the fingerprint, the culprit, the
GPU state and the matched known issue are properties. A run of more than `MAX_CASES_PER_FILE` cells
(Buildkite Test Engine's limit per file) or of more than `MAX_FILE_BYTES` (under GitLab's 30 MB)
is written as several files: `junit.xml`, `junit-2.xml`, ... (`write_junit_files`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from junitparser import Error, Failure, JUnitXmlError, TestCase, xunit2

from soakmatrix.matrix.contracts.flags import format_value
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

from .files import write_atomic

CLASSNAME_PREFIX = "soakmatrix"
MAX_LOG_LINES = 60  # last log lines kept in system-out
MAX_STUCK_FRAMES = 80  # stuck frames kept in system-out
MAX_LINE_CHARS = 2000  # a single runaway log line is cut here
MAX_SYSTEM_OUT_CHARS = 32_000  # one case's system-out; the whole evidence is in the attachments
MAX_CASES_PER_FILE = 5000  # Buildkite Test Engine: test cases per uploaded file
MAX_FILE_BYTES = 28 * 2**20  # GitLab refuses JUnit files over 30 MB; margin for the suite's header

# XML 1.0 allows tab, LF, CR and everything from U+0020 except surrogates, U+FFFE and U+FFFF.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NOT_NAME_SAFE = re.compile(r"[^A-Za-z0-9_\-]+")


class JUnitMergeError(ValueError):
    """A file given to `merge_junit` is missing or is not JUnit XML; the message names it."""


def xml_safe(text: Any) -> str:
    """The text with characters XML 1.0 cannot carry spelled as `\\xNN` (so nothing is lost)."""
    return _XML_ILLEGAL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def name_safe(part: str) -> str:
    """A classname segment: dots (Jenkins' package separator) and odd characters become `_`."""
    return _NOT_NAME_SAFE.sub("_", part).strip("_") or "unknown"


def classname_for(model: str, gpu: str) -> str:
    return f"{CLASSNAME_PREFIX}.{name_safe(model)}.{name_safe(gpu)}"


def mttf_of(result: CellResult) -> float | None:
    """This run's MTTF estimate for the cell: exposure per hang (None when it did not hang)."""
    if result.outcome is not Outcome.HANG:
        return None
    return result.time_to_hang_s if result.time_to_hang_s is not None else result.exposure_s


def describe_stop(result: CellResult) -> str:
    """What stopped and when, for the failure message, when the soak job gave no message."""
    when = _secs(result.time_to_hang_s if result.time_to_hang_s is not None else result.exposure_s)
    text = f"token generation stopped after {when} under load"
    if result.detector:
        text += f"; {result.detector} fired"
        if result.detected_after_s is not None:
            text += f" {_secs(result.detected_after_s)} after the last progress"
    if result.node:
        text += f" on {result.node}"
    return text


def case_properties(result: CellResult) -> dict[str, str]:
    """The test-case properties: model, GPU, every flag, vLLM version, exposure, MTTF, signature, detector."""
    props: dict[str, str] = {
        "cell_id": result.cell_id,
        "model": result.model,
        "gpu": result.gpu_type,
        "workload": result.workload,
    }
    for name, value in sorted(result.flags.items()):
        props[f"flag.{name}"] = format_value(value)
    props["vllm_version"] = result.vllm_version
    if result.build:  # a matrix with builds; the regression.* properties come from reports/regressions.py
        props.update({"build": result.build, **result.regression})
        if result.python:  # the interpreter the soak ran in: the build's virtualenv or py_executable
            props["build.python"] = result.python
    props["engine"] = result.engine
    props["exposure_s"] = f"{result.exposure_s:.1f}"
    mttf = mttf_of(result)
    if mttf is not None:
        props["mttf_s"] = f"{mttf:.1f}"
    elif result.outcome is Outcome.PASSED and result.exposure_s > 0:
        # no hang in T seconds: MTTF >= T/3 at 95% (rule of three)
        props["mttf_lower_95_s"] = f"{result.exposure_s / 3:.1f}"
    if result.time_to_hang_s is not None:
        props["time_to_hang_s"] = f"{result.time_to_hang_s:.1f}"
    props["signature"] = result.signature or ""
    props["detector"] = result.detector or ""
    if result.fingerprint:
        props["fingerprint"] = result.fingerprint
    if result.culprit:
        props["culprit"] = result.culprit
    state = (result.gpu_state or {}).get("state")
    if result.gpu_state:
        props["gpu_state"] = state or "not measured"
    stalls = result.stalls
    if stalls:  # hang verdicts after which tokens came again (a starved host, a slow step)
        props["stalls"] = str(len(stalls))
        props["longest_stall_s"] = f"{max(float(s.get('silent_s') or 0) for s in stalls):.1f}"
    props["node"] = result.node
    props["attempt"] = str(result.attempt)
    props["tokens"] = str(result.tokens)
    props["requests"] = str(result.requests)
    return props


def known_issue_properties(issue: Any) -> dict[str, str]:
    """`known_issue` (its link, else its id), with its title, status and workaround."""
    if issue is None:
        return {}
    props = {
        "known_issue": issue.url or issue.id,
        "known_issue.id": issue.id,
        "known_issue.title": issue.title,
        "known_issue.status": issue.status,
    }
    if issue.workaround:
        props["known_issue.workaround"] = issue.workaround
    return props


def attachment_lines(result: CellResult) -> list[str]:
    """`[[ATTACHMENT|path]]` for each evidence file (Jenkins junit-attachments, GitLab)."""
    return [
        f"[[ATTACHMENT|{path}]]" for _, path in sorted(result.artifacts.items()) if path and not str(path).endswith("/")
    ]


def evidence_text(result: CellResult, issue: Any = None) -> str:
    """Evidence excerpts for system-out: the culprit per role, stuck frames and the last log lines,
    then the evidence files as attachments; bounded by MAX_SYSTEM_OUT_CHARS."""
    out = [f"cell {result.cell_id}: {result.outcome.value}" + (f" ({result.signature})" if result.signature else "")]
    if result.message:
        out.append(result.message)
    for i, stall in enumerate(result.stalls, 1):
        stacks = f"; stacks: {stall['evidence']}" if stall.get("evidence") else ""
        out.append(
            f"stall {i}, recovered: {float(stall.get('silent_s') or 0):.1f} s of silence "
            f"({stall.get('detector')}: {_cut(str(stall.get('message', '')))}){stacks}"
        )
    if issue is not None:
        out.append(f"known issue [{issue.status}]: {issue.title} {issue.url}".rstrip())
    if result.gpu_state:
        out.append(f"gpu: {result.gpu_state.get('state') or result.gpu_state.get('note') or 'not measured'}")
    if result.threads:
        out += ["", "threads per role (culprits first, then the threads waiting on them):"]
        for t in result.threads[:12]:
            frames = list(t.get("frames", []))
            out.append(f"  {t.get('role')} {t.get('thread')}: {t.get('kind')} - {t.get('reason')}")
            out += [f"      {_cut(f)}" for f in frames[: 8 if t.get("kind") == "culprit" else 3]]
    if result.stuck_frames:
        frames = result.stuck_frames[-MAX_STUCK_FRAMES:]
        out += ["", f"stuck frames ({len(frames)} of {len(result.stuck_frames)}):"]
        out += [f"  {_cut(f)}" for f in frames]
    if result.log_tail:
        lines = result.log_tail[-MAX_LOG_LINES:]
        out += ["", f"last log lines ({len(lines)} of {len(result.log_tail)}):"]
        out += [f"  {_cut(line)}" for line in lines]
    tail = []
    if result.artifacts:
        tail = ["", "artifacts:"] + [f"  {k}: {v}" for k, v in sorted(result.artifacts.items())]
        tail += attachment_lines(result)
    text = "\n".join(out)
    room = MAX_SYSTEM_OUT_CHARS - sum(len(t) + 1 for t in tail)
    if len(text) > room:
        text = text[: max(0, room - 60)] + f"\n[... cut at {MAX_SYSTEM_OUT_CHARS} characters: see the attachments]"
    return xml_safe("\n".join([text, *tail]))


def test_case(result: CellResult, known_issues: Sequence[Any] = ()) -> xunit2.TestCase:
    """One cell's test case; `known_issues` (reports.known_issues) are matched to its finding."""
    if not isinstance(result.outcome, Outcome):
        result = dataclasses.replace(result)  # re-runs __post_init__: an outcome set as a string
    case = xunit2.TestCase(
        xml_safe(result.cell_name),
        classname_for(result.model, result.gpu_type),
        round(result.duration_s or result.exposure_s, 3),
    )
    issue = _match(known_issues, result)
    for name, value in {**case_properties(result), **known_issue_properties(issue)}.items():
        case.add_property(xml_safe(name), xml_safe(value))
    final = _final_result(result)
    for message in result.retries:
        interim = xunit2.FlakyFailure() if Outcome(result.outcome) is Outcome.PASSED else xunit2.RerunFailure()
        interim.type = Outcome.INFRA_ERROR.value
        interim.message = xml_safe(_cut(message))
        case.add_interim_result(interim)
    if final is not None:
        case.result = [final]
    case.system_out = evidence_text(result, issue)
    return case


def _match(known_issues: Sequence[Any], result: CellResult) -> Any:
    if not known_issues:
        return None
    from .known_issues import match_result

    return match_result(known_issues, result)


# a name pytest would otherwise collect when imported into a test module; mypy knows no such function attribute
test_case.__test__ = False  # type: ignore[attr-defined]


def _final_result(result: CellResult) -> Failure | Error | None:
    outcome, signature = Outcome(result.outcome), result.signature or "unknown"
    if outcome is Outcome.PASSED:
        return None
    if outcome is Outcome.HANG:
        final: Failure | Error = Failure(
            xml_safe(result.message or describe_stop(result)), f"hang:{xml_safe(signature)}"
        )
    elif outcome is Outcome.CRASH:
        final = Failure(xml_safe(result.message or "the engine process died"), f"crash:{xml_safe(signature)}")
    else:
        final = Error(xml_safe(result.message or outcome.value), outcome.value)
    details = [
        f"{k}: {v}"
        for k, v in (
            ("detector", result.detector),
            ("node", result.node),
            ("time_to_hang_s", result.time_to_hang_s),
            ("exposure_s", round(result.exposure_s, 1)),
        )
        if v not in (None, "")
    ]
    if result.stuck_frames:
        details.append("stuck in: " + _cut(blocking_frame(result.stuck_frames)))
    final.text = xml_safe("\n".join(details))
    return final


# The C runtime under a blocked call (libc's futex or nanosleep, libpython, raw addresses, CPython's own
# .c files) is the same for every hang; the frame above it is what blocks. As jobs.culprit's NATIVE_NOISE,
# which reports may not import.
_RUNTIME_FRAME = re.compile(
    r"^0x[0-9a-fA-F]+\b|\((?:lib(?:c|pthread|python[\d.]*|m|dl|rt)|ld-linux[\w.-]*)(?:\.so[^)]*)?\)$|"
    r"\.(?:c|h|cc|cpp)(?::\d+)?\)$|\(<frozen "
)


def blocking_frame(stuck_frames: Sequence[str]) -> str:
    """The culprit's blocking frame: the innermost stuck frame (they come innermost first) above the C
    runtime, else the innermost."""
    return next((f for f in stuck_frames if not _RUNTIME_FRAME.search(f)), stuck_frames[0])


def build_suite(
    results: Iterable[CellResult],
    suite_name: str,
    properties: Mapping[str, Any] | None = None,
    known_issues: Sequence[Any] = (),
) -> xunit2.TestSuite:
    results = list(results)
    suite = xunit2.TestSuite(xml_safe(suite_name))
    for name, value in (properties or {}).items():
        suite.add_property(xml_safe(name), xml_safe(value))
    if results:
        started = min(r.started_at for r in results)
        suite.timestamp = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    suite.add_testcases([test_case(r, known_issues) for r in results])
    return suite


def write_junit(
    results: Iterable[CellResult],
    path: str | os.PathLike,
    suite_name: str,
    properties: dict | None = None,
    known_issues: Sequence[Any] = (),
) -> Path:
    """Write one suite with a test case per result; the file appears whole or not at all. A run too
    big for one file continues in `<stem>-2.xml`, ... (`write_junit_files`); returns the first."""
    return write_junit_files(results, path, suite_name, properties, known_issues)[0]


def write_junit_files(
    results: Iterable[CellResult],
    path: str | os.PathLike,
    suite_name: str,
    properties: dict | None = None,
    known_issues: Sequence[Any] = (),
    max_cases: int = MAX_CASES_PER_FILE,
    max_bytes: int = MAX_FILE_BYTES,
) -> list[Path]:
    """One file while the run fits (`max_cases` cases, `max_bytes`), else parts `path`, `<stem>-2.xml`,
    ... each a whole suite of the same name (consumers merge same-named suites), none over either
    limit; parts left over from a bigger earlier write are removed."""
    results = list(results)
    path = Path(path)
    parts = _split(results, max_cases, max_bytes)
    written = []
    for n, part in enumerate(parts, 1):
        target = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        xml = xunit2.JUnitXml(xml_safe(suite_name))
        props = dict(properties or {})
        if len(parts) > 1:
            props.update({"part": f"{n}/{len(parts)}"})
        xml.add_testsuite(build_suite(part, suite_name, props, known_issues))
        xml.update_statistics()
        written.append(_write_atomic(xml, target))
    n = len(parts) + 1
    while (stale := path.with_name(f"{path.stem}-{n}{path.suffix}")).exists():
        stale.unlink()
        n += 1
    return written


def _split(results: list[CellResult], max_cases: int, max_bytes: int) -> list[list[CellResult]]:
    """Consecutive groups under both limits, sized by each case's serialised length (an estimate
    from its system-out and log lines: exact enough, with the margin MAX_FILE_BYTES keeps)."""
    parts: list[list[CellResult]] = [[]]
    size = 0
    for r in results:
        cost = 2048 + len(evidence_text(r).encode()) * 2 + sum(len(str(line)) for line in r.log_tail[-MAX_LOG_LINES:])
        if parts[-1] and (len(parts[-1]) >= max_cases or size + cost > max_bytes):
            parts.append([])
            size = 0
        parts[-1].append(r)
        size += cost
    return parts


def read_junit(path: str | os.PathLike) -> xunit2.JUnitXml:
    """Parse a JUnit file, with an error that names the file and line when it is not JUnit XML."""
    path = Path(path)
    if not path.is_file():
        raise JUnitMergeError(f"{path}: no such file")
    try:
        # junitparser annotates its constructors as returning the base class; they return cls()
        return cast(xunit2.JUnitXml, xunit2.JUnitXml.fromfile(str(path)))
    except ElementTree.ParseError as exc:
        line, column = exc.position
        raise JUnitMergeError(f"{path}:{line}:{column}: not well-formed XML ({exc})") from None
    except JUnitXmlError as exc:
        raise JUnitMergeError(
            f"{path}: not JUnit XML: the root is neither <testsuites> nor <testsuite> ({exc})"
        ) from None


def merge_junit(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Merge files from many workers or shards: suites of the same name become one suite.

    A cell reported by two files (a re-run shard) keeps its last report, so CI dashboards that
    keep only the first of two same-named cases (GitLab) see the newest verdict.
    """
    if not paths:
        raise JUnitMergeError("no JUnit files to merge")
    suites: dict[str, xunit2.TestSuite] = {}
    cases: dict[str, dict[tuple[str, str], TestCase]] = {}
    for path in paths:
        for suite in read_junit(path):
            target = suites.get(suite.name)
            if target is None:
                target = suites[suite.name] = xunit2.TestSuite(suite.name)
                cases[suite.name] = {}
                for prop in suite.properties():
                    target.add_property(prop.name, prop.value)
                if suite.timestamp:
                    target.timestamp = suite.timestamp
            elif suite.timestamp and (not target.timestamp or suite.timestamp < target.timestamp):
                target.timestamp = suite.timestamp
            for case in suite:
                cases[suite.name][(case.classname or "", case.name or "")] = case
    merged = xunit2.JUnitXml()
    for name, suite in suites.items():
        suite.extend(cases[name].values())
        suite.update_statistics()
        merged.add_testsuite(suite)
    merged.update_statistics()
    return _write_atomic(merged, Path(out))


def _write_atomic(xml: xunit2.JUnitXml, path: Path) -> Path:
    return write_atomic(path, xml.write)


def _cut(line: str) -> str:
    line = str(line).rstrip("\n")
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [...]"


def _secs(seconds: float | None) -> str:
    from soakmatrix.matrix.contracts.durations import format_duration

    return "an unknown time" if seconds is None else f"{format_duration(seconds)} ({seconds:.0f} s)"
