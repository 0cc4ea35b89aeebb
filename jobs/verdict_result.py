"""From a watch's end (a detector's verdict or none) to the `CellResult` fields that say what happened.

The soak job (`jobs.soak.run_cell`) and the pytest plugin's `hang_watchdog` both end a watch here,
so a hang reads the same whichever of them saw it: the same outcome, signature and message, and an
exposure that ends where the hang began. Pure: the callers capture the evidence and read the log.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

from .detect.protocol import HangVerdict
from .evidence import Evidence
from .signatures import Classification, classify, clues_from_texts


def hang_began(verdict: HangVerdict) -> float:
    """When the hang began: the last progress the detector saw, else when it fired."""
    return verdict.since if verdict.since is not None else verdict.at


def record_exposure(
    result: CellResult, load_start: float, verdict: HangVerdict | None, now: float, scale: float
) -> None:
    """Exposure from the load's start to `now`, or with a verdict to where the hang began, so MTTF
    estimates (exposure / hangs) do not count the detection delay as time the engine survived.
    `scale` turns wall seconds into engine seconds (the simulated engine's time scale)."""
    load_end = now if verdict is None else hang_began(verdict)
    wall = max(0.0, load_end - load_start)
    result.exposure_s = wall * scale
    result.wall_exposure_s = round(wall, 3)
    result.time_scale = scale


STALLS_WITH_EVIDENCE = 3  # a cell that keeps stalling keeps the stacks of its first few stalls


def record_stall(
    stalls: list[dict[str, Any]], verdict: HangVerdict, evidence: Evidence, resumed_at: float | None, stalls_dir: Path
) -> dict[str, Any]:
    """A hang verdict after which tokens came again (`jobs.hang_confirmation`): appended to `stalls`
    (a result's `stalls`), its evidence moved to `stalls_dir/<n>` for the first few, else deleted."""
    began = hang_began(verdict)
    stall = {
        "detector": verdict.detector,
        "message": verdict.message,
        "began_at": began,
        "verdict_at": verdict.at,
        "resumed_at": resumed_at,
        "silent_s": round((resumed_at or verdict.at) - began, 2),
        "evidence_s": round(evidence.seconds, 2),
    }
    if len(stalls) < STALLS_WITH_EVIDENCE:
        kept = stalls_dir / str(len(stalls) + 1)
        kept.parent.mkdir(parents=True, exist_ok=True)
        evidence.folder.rename(kept)
        stall["evidence"] = str(kept)
    else:
        shutil.rmtree(evidence.folder, ignore_errors=True)
    stalls.append(stall)
    return stall


def stalls_summary(stalls: Sequence[dict[str, Any]]) -> str:
    """'' or '; 2 stalls that recovered (longest 7.2 s of silence)', for a passing cell's message."""
    if not stalls:
        return ""
    longest = max(s["silent_s"] for s in stalls)
    return f"; {len(stalls)} stall{'s' if len(stalls) > 1 else ''} that recovered (longest {longest:.1f} s of silence)"


def record_finding(
    result: CellResult,
    verdict: HangVerdict,
    evidence: Evidence,
    log_lines: Sequence[str],
    exit_code: int | None,
    load_start: float,
    scale: float,
    running: float | None,
) -> Classification:
    """Classify a verdict with its evidence and write the finding into `result`: hang or crash,
    signature, stuck frames, time to hang (engine seconds), the one-line message, the evidence's
    files and log tail. `running` is how many requests the engine last reported running."""
    gpu = evidence.gpu.busy if evidence.gpu is not None else None
    cls = classify(
        clues_from_texts(
            evidence.stack_texts, log_lines, verdict_kind=verdict.kind, exit_code=exit_code, hint=verdict.hint, gpu=gpu
        )
    )
    result.artifacts.update(evidence.artifacts)
    kind = cls.outcome or verdict.kind
    result.outcome = Outcome.HANG if kind == "hang" else Outcome.CRASH
    result.signature = cls.signature
    result.fingerprint = cls.fingerprint
    result.stuck_frames = list(cls.stuck_frames)
    record_culprit(result, cls, evidence)
    result.detector = verdict.detector
    result.detected_after_s = round(verdict.detected_after_s, 2) if verdict.detected_after_s is not None else None
    result.time_to_hang_s = round(max(0.0, hang_began(verdict) - load_start) * scale, 2)
    result.message = describe(verdict, cls, running)
    result.causes = list(cls.causes)
    result.verdict = {
        "detector": verdict.detector,
        "kind": verdict.kind,
        "at": verdict.at,
        "since": verdict.since,
        "message": verdict.message,
        "hint": verdict.hint,
        "details": _jsonable(dict(verdict.details)),
    }
    result.log_tail = evidence.log_tail
    return cls


def record_culprit(result: CellResult, cls: Classification, evidence: Evidence) -> None:
    """The culprit, the threads per role and the GPU state (the soak's and the watch's findings alike)."""
    result.culprit = cls.culprit
    result.threads = [dict(t) for t in cls.threads]
    result.gpu_state = evidence.gpu.to_dict() if evidence.gpu is not None else {}
    if evidence.stacks_unreachable:
        result.stacks_unreachable = evidence.stacks_unreachable


def describe(verdict: HangVerdict, cls: Classification, running: float | None) -> str:
    """One sentence a maintainer reads first: what stopped, when, and who noticed."""
    after = f" after {verdict.detected_after_s:.1f} s" if verdict.detected_after_s is not None else ""
    sig = f" [{cls.signature}{': ' + ', '.join(cls.causes) if cls.causes else ''}]" if cls.signature else ""
    if verdict.kind == "crash" and (cls.outcome or "crash") == "crash":
        return f"server failed at {_clock(verdict.at)}: {verdict.message}; detector {verdict.detector} fired{sig}"
    when = _clock(hang_began(verdict))
    busy = f" with {running:.0f} requests running" if running else ""
    return f"tokens stopped at {when}{busy}; detector {verdict.detector} fired{after}{sig}: {verdict.message}"


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%H:%M:%S")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
