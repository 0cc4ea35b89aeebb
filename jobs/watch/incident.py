"""One incident: evidence first, then signature and fingerprint, then the user's `--on-hang` command.

The evidence is the soak's (`jobs/evidence.py`: py-spy of every process of the server's tree,
/metrics, log tail, GPU state), time-boxed, plus what /proc tells without ptrace, because a sidecar
or an unprivileged user may not be allowed to attach: then the notes say so plainly, with the fix.
The classification is the soak's (`jobs/signatures.py`), so a production incident carries the same
signature and fingerprint as the soak finding of the same bug. The result is a `CellResult` (outcome
hang or crash) for the history store; the hook runs in its own session with the evidence folder in
its environment, and the watch keeps watching while it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from soakmatrix.jobs.detect.protocol import HangVerdict
from soakmatrix.jobs.evidence import Evidence, capture
from soakmatrix.jobs.signatures import Classification, classify, clues_from_texts
from soakmatrix.jobs.verdict_result import record_culprit
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

from .target import NO_PID, Target, proc_snapshot

PTRACE_DENIED = re.compile(r"ermission|not permitted|ptrace", re.I)
PTRACE_HELP = (
    "py-spy could not attach (ptrace not permitted): run the watch as root or as the server's user "
    "with kernel.yama.ptrace_scope=0, or in Kubernetes give the sidecar the SYS_PTRACE capability and "
    "shareProcessNamespace: true; the evidence falls back to /proc (proc-snapshot.json), "
    "/metrics and the log"
)


@dataclass(frozen=True)
class IncidentOptions:
    out_dir: Path
    pyspy_timeout_s: float = 10.0
    budget_s: float = 30.0  # all of the evidence, so a restart hook is not held up long
    tail_lines: int = 200
    on_hang: str | None = None  # a shell command
    on_hang_timeout_s: float = 600.0


@dataclass
class Incident:
    folder: Path
    verdict: HangVerdict
    classification: Classification
    result: CellResult
    evidence: Evidence
    hook: threading.Thread | None = None
    notes: list[str] = field(default_factory=list)


class _Subject:
    """What `evidence.capture` reads of a server: pid, URL, log file and text."""

    def __init__(self, pid: int | None, base_url: str, log_path: Path, lines: Sequence[str]) -> None:
        self.pid = pid if pid is not None else NO_PID
        self.base_url, self.log_path, self._lines = base_url, log_path, lines

    def log_text(self, *_: Any) -> str:
        return "\n".join(self._lines) + "\n"


def new_folder(out_dir: Path, verdict: HangVerdict) -> Path:
    stamp = datetime.fromtimestamp(verdict.at, UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out_dir / f"{stamp}-{verdict.detector}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    folder.mkdir(parents=True)
    return folder


def keep_evidence(
    verdict: HangVerdict,
    target: Target,
    log_lines: Sequence[str],
    options: IncidentOptions,
    *,
    capture_fn: Callable[..., Evidence] = capture,
) -> tuple[Path, Evidence, list[str]]:
    folder = new_folder(options.out_dir, verdict)
    notes: list[str] = []
    pid = target.resolve()
    if pid is None:
        notes.append(f"no server process found: {target.problem}; no stacks (give --pid)")
    log_path = folder / "log-tail.txt"
    log_path.write_text("\n".join(log_lines[-options.tail_lines :]) + "\n")
    ev = capture_fn(
        _Subject(pid, target.base_url, log_path, log_lines),
        folder,
        pyspy_timeout_s=options.pyspy_timeout_s,
        budget_s=options.budget_s,
        tail_lines=options.tail_lines,
    )
    ev.artifacts["log_tail"] = ev.artifacts.pop("server_log", str(log_path))
    if pid is not None and any(PTRACE_DENIED.search(n) for n in ev.notes):
        notes.append(PTRACE_HELP)
    procs = [proc_snapshot(p.pid) for p in target.processes()]
    if procs:
        path = folder / "proc-snapshot.json"
        path.write_text(json.dumps(procs, indent=1, default=str))
        ev.artifacts["proc_snapshot"] = str(path)
    if notes:
        with open(folder / "evidence-notes.txt", "a") as f:
            f.write("\n".join(notes) + "\n")
        ev.artifacts["evidence_notes"] = str(folder / "evidence-notes.txt")
    return folder, ev, notes


def watch_cell(target: Target, model: str, gpu: str = "") -> tuple[str, str]:
    """The watched server as a cell: a stable id per URL and model, a readable unique name."""
    name = f"{model or 'unknown-model'}|{gpu or '-'}|watch|{target.host}:{target.port}"
    return hashlib.sha256(f"watch|{target.display_url}|{model}".encode()).hexdigest()[:12], name


def build_result(
    verdict: HangVerdict,
    cls: Classification,
    ev: Evidence,
    target: Target,
    *,
    model: str,
    watch_started: float,
    running: float | None,
    folder: Path,
) -> CellResult:
    gpu = _gpu_name(ev)
    cell_id, cell_name = watch_cell(target, model, gpu)
    kind = cls.outcome or verdict.kind
    began = verdict.since if verdict.since is not None else verdict.at
    sig = f" [{cls.signature}]" if cls.signature else ""
    busy = f" with {running:.0f} requests running" if running else ""
    result = CellResult(
        cell_id=cell_id,
        cell_name=cell_name,
        outcome=Outcome.HANG if kind == "hang" else Outcome.CRASH,
        model=model,
        gpu_type=gpu,
        workload="watch",
        signature=cls.signature,
        fingerprint=cls.fingerprint,
        detector=verdict.detector,
        engine="watch",
        node=socket.gethostname(),
        message=f"{'hang' if kind == 'hang' else 'failure'}{busy}, found by {verdict.detector}{sig}: {verdict.message}",
        time_to_hang_s=round(max(0.0, began - watch_started), 2),
        detected_after_s=round(verdict.detected_after_s, 2) if verdict.detected_after_s is not None else None,
        exposure_s=round(max(0.0, began - watch_started), 2),
        started_at=watch_started,
        ended_at=verdict.at,
        stuck_frames=list(cls.stuck_frames),
        log_tail=ev.log_tail[-50:],
        artifacts={**ev.artifacts, "evidence_dir": str(folder)},
    )
    result.url, result.pid, result.causes = target.display_url, target.pid, list(cls.causes)
    result.evidence_s = round(ev.seconds, 2)
    result.verdict = {
        "detector": verdict.detector,
        "kind": verdict.kind,
        "at": verdict.at,
        "since": verdict.since,
        "message": verdict.message,
        "hint": verdict.hint,
    }
    record_culprit(result, cls, ev)
    return result


def _gpu_name(ev: Evidence) -> str:
    path = ev.artifacts.get("gpu_state")
    if not path:
        return ""
    try:
        gpus = json.loads(Path(path).read_text()).get("gpus") or []
        return str(gpus[0]["name"]) if gpus else ""
    except (OSError, ValueError, KeyError):
        return ""


def handle(
    verdict: HangVerdict,
    target: Target,
    log_lines: Sequence[str],
    options: IncidentOptions,
    *,
    model: str,
    watch_started: float,
    running: float | None = None,
    capture_fn: Callable[..., Evidence] = capture,
) -> Incident:
    """Evidence, classification, result (written to the folder's result.json), then the hook."""
    folder, ev, notes = keep_evidence(verdict, target, log_lines, options, capture_fn=capture_fn)
    clues = clues_from_texts(ev.stack_texts, log_lines, verdict_kind=verdict.kind, hint=verdict.hint)
    cls = classify(clues)
    result = build_result(
        verdict, cls, ev, target, model=model, watch_started=watch_started, running=running, folder=folder
    )
    incident = Incident(folder, verdict, cls, result, ev, notes=[*notes, *ev.notes])
    if options.on_hang:
        result.artifacts["on_hang_log"] = str(folder / "on-hang.log")
        incident.hook = run_hook(options.on_hang, hook_env(result, folder), folder, options.on_hang_timeout_s)
    (folder / "result.json").write_text(result.to_json())
    return incident


def hook_env(result: CellResult, folder: Path) -> dict[str, str]:
    return {
        "SOAKMATRIX_EVIDENCE_DIR": str(folder),
        "SOAKMATRIX_SIGNATURE": result.signature or "",
        "SOAKMATRIX_FINGERPRINT": result.fingerprint or "",
        "SOAKMATRIX_OUTCOME": result.outcome.value,
        "SOAKMATRIX_DETECTOR": result.detector or "",
        "SOAKMATRIX_MESSAGE": result.message[:2000],
        "SOAKMATRIX_URL": result.url,
        "SOAKMATRIX_PID": str(result.pid or ""),
    }


def run_hook(command: str, env: dict[str, str], folder: Path, timeout_s: float) -> threading.Thread:
    """Run the user's shell command in its own session; its output and exit go to on-hang.log."""

    def run() -> None:
        log = folder / "on-hang.log"
        with open(log, "ab") as out:
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(
                    command,
                    shell=True,
                    env={**os.environ, **env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                out.write(f"\n[soakmatrix watch] could not start the hook: {exc}\n".encode())
                return
            try:
                code = proc.wait(timeout=timeout_s)
                out.write(f"\n[soakmatrix watch] hook exited {code} after {time.monotonic() - t0:.1f} s\n".encode())
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                out.write(f"\n[soakmatrix watch] hook killed after {timeout_s:.0f} s\n".encode())

    thread = threading.Thread(target=run, name="watch-on-hang", daemon=True)
    thread.start()
    return thread
