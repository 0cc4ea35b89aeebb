"""Evidence of a hang, captured before teardown, all under the cell's artifact folder.

`py-spy dump --native` of every process in the server's tree, all at once (each with a timeout,
killed if py-spy itself hangs), vLLM's own watchdog stack dumps (`VLLM_STACK_DUMP_*` in the artifact folder), a
/metrics snapshot, the log tail, the scheduler dump lines vLLM prints on a fatal error, and GPU
state (`jobs.gpu_state`: NVML or nvidia-smi; "no GPU: not measured" otherwise). When py-spy may not
attach (no ptrace permission in a container), the notes say so and what to grant. Every step is bounded and none
raises: missing evidence is recorded as a note, never as a failed cell.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import gpu_state as gpu_state_mod
from .teardown import tree

SCHEDULER_DUMP = re.compile(
    r"Dumping input data|Dumping scheduler output|Dumping scheduler stats|"
    r"SchedulerOutput\(|SchedulerStats\(|NewRequestData\(|CachedRequestData\("
)


@dataclass
class Evidence:
    folder: Path
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> path
    stack_texts: list[str] = field(default_factory=list)  # py-spy and faulthandler dumps
    log_tail: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    gpu: gpu_state_mod.GpuState | None = None  # None until measured (or not) at capture
    stacks_unreachable: str | None = None  # why no process could be dumped


def pyspy_dump(
    pid: int,
    timeout_s: float = 20.0,
    native: bool = True,
    runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    attempts: int = 2,
) -> tuple[str, str | None]:
    """py-spy's dump of one process: (text, problem). A py-spy that hangs is killed at the timeout;
    one that fails (a transient ptrace error, no unwinding support for --native) is retried without
    --native, then once more."""
    exe = shutil.which("py-spy") or _venv_pyspy()
    if exe is None:
        return "", "py-spy not found"
    problem = ""
    for _attempt in range(attempts):
        for with_native in (True, False) if native else (False,):
            argv = [exe, "dump", "--pid", str(pid), *(["--native"] if with_native else [])]
            try:
                done = runner(argv, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return "", f"py-spy timed out after {timeout_s:.0f} s on pid {pid}"
            except OSError as exc:
                return "", f"py-spy failed: {exc}"
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout, None
            lines = (done.stderr or done.stdout).strip().splitlines()
            problem = f"py-spy exit {done.returncode} on pid {pid}: {lines[-1] if lines else ''}"
        if not psutil.pid_exists(pid):
            break
        time.sleep(0.5)
    return "", problem


def _venv_pyspy() -> str | None:
    import sys

    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else None


def scrape_text(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode("utf-8", "replace")


def gpu_state() -> dict[str, Any] | None:
    """Per-GPU memory, utilisation and processes (`jobs.gpu_state`); None when not measured."""
    state = gpu_state_mod.measure()
    return state.to_dict() if state.measured else None


PTRACE_DENIED = re.compile(
    r"Permission denied|Operation not permitted|os error 1\b|os error 13\b|"
    r"ptrace|CAP_SYS_PTRACE",
    re.I,
)


def ptrace_problem(problems: Sequence[str], scope_file: str = "/proc/sys/kernel/yama/ptrace_scope") -> str | None:
    """Why py-spy could not attach, when that is the reason: what a container or host must allow."""
    denied = [p for p in problems if PTRACE_DENIED.search(p)]
    if not denied:
        return None
    try:
        scope = Path(scope_file).read_text().strip()
    except OSError:
        scope = "unknown"
    return (
        f"ptrace not permitted ({denied[0]}): py-spy needs the SYS_PTRACE capability (docker run "
        f"--cap-add SYS_PTRACE, Kubernetes securityContext.capabilities.add: [SYS_PTRACE]) or "
        f"kernel.yama.ptrace_scope 0 (now {scope}); the fingerprint falls back to the log's tracebacks "
        f"and vLLM's own stack dumps (--watchdog-config dump_dir)"
    )


def scheduler_dump_lines(lines: Sequence[str], context: int = 12) -> list[str]:
    """The lines vLLM prints on a fatal error about its scheduler state, with what follows them."""
    out: list[str] = []
    keep = 0
    for line in lines:
        if SCHEDULER_DUMP.search(line):
            keep = context
        if keep > 0:
            out.append(line)
            keep -= 1
    return out


def capture(
    server: Any,
    folder: str | Path,
    *,
    pyspy_timeout_s: float = 20.0,
    budget_s: float = 90.0,
    tail_lines: int = 50,
    dump_dirs: Sequence[str | Path] | None = None,
    stop: Any = None,
    pyspy: Callable[..., tuple[str, str | None]] = pyspy_dump,
    scrape: Callable[[str, float], str] = scrape_text,
    gpu: Callable[[Sequence[int]], gpu_state_mod.GpuState] = gpu_state_mod.measure,
) -> Evidence:
    """Everything worth keeping about a stuck server (a RunningServer: .pid, .base_url, .log_text()).
    `stop` (a threading.Event) skips the stack dumps when the cell is already cancelled."""
    t0 = time.monotonic()
    ev = Evidence(Path(folder))
    ev.folder.mkdir(parents=True, exist_ok=True)

    # stacks first: they are what a hang looks like, and the least likely to survive teardown. Every
    # process at once: the dumps show one moment of the tree, and an engine that dies soon after its
    # hang (vLLM's RPC timeout) is caught before it does, not after the API server's dump
    dumps: list[str] = []
    problems: list[str] = []
    procs = list(tree(server.pid))
    if stop is not None and stop.is_set():
        ev.notes.append("cancelled: no process dumped")
        procs = []
    named: list[tuple[psutil.Process, str]] = []
    for proc in procs:
        try:
            named.append((proc, " ".join(proc.cmdline()[:4]) or proc.name()))
        except psutil.Error:
            continue
    if named:
        pool = ThreadPoolExecutor(max_workers=min(8, len(named)), thread_name_prefix="py-spy")
        futures = [pool.submit(pyspy, proc.pid, pyspy_timeout_s) for proc, _ in named]
        done, _ = wait_futures(futures, timeout=max(0.0, budget_s - (time.monotonic() - t0)))
        pool.shutdown(wait=False, cancel_futures=True)
        if len(done) < len(futures):
            ev.notes.append("evidence budget spent: some processes not dumped")
        for (proc, name), future in zip(named, futures, strict=True):
            if future not in done:
                continue
            text, problem = future.result()
            if problem:
                ev.notes.append(problem)
                problems.append(problem)
            if text:
                header = text if text.startswith("Process ") else f"Process {proc.pid}: {name}\n{text}"
                dumps.append(header)
    denied = ptrace_problem(problems)
    if denied:
        ev.notes.insert(0, denied)
        if not dumps:
            ev.stacks_unreachable = denied
    if dumps:
        path = ev.folder / "py-spy.txt"
        path.write_text("\n\n".join(dumps))
        ev.artifacts["py_spy"] = str(path)
        ev.stack_texts.extend(dumps)

    # vLLM's --watchdog-config points dump_dir at the cell's folder (the server log's folder)
    if dump_dirs is None:
        dump_dirs = [Path(server.log_path).parent] if getattr(server, "log_path", None) else []
    dumps_found = sorted({p for d in [*dump_dirs, ev.folder] for p in Path(d).glob("VLLM_STACK_DUMP_*")})
    for dump in dumps_found:
        ev.artifacts[dump.name] = str(dump)
        try:
            ev.stack_texts.append(dump.read_text(errors="replace"))
        except OSError as exc:
            ev.notes.append(f"{dump.name}: {exc}")

    try:
        text = scrape(f"{server.base_url}/metrics", 10.0)
        path = ev.folder / "metrics.txt"
        path.write_text(text)
        ev.artifacts["metrics"] = str(path)
    except Exception as exc:  # noqa: BLE001 - a failed snapshot is noted; the rest of the evidence is still taken
        ev.notes.append(f"/metrics snapshot failed: {type(exc).__name__}: {exc}")

    log_lines = server.log_text().splitlines()
    ev.log_tail = log_lines[-tail_lines:]
    if hasattr(server, "log_path"):
        ev.artifacts["server_log"] = str(server.log_path)
    sched = scheduler_dump_lines(log_lines)
    if sched:
        path = ev.folder / "scheduler-dump.txt"
        path.write_text("\n".join(sched) + "\n")
        ev.artifacts["scheduler_dump"] = str(path)

    try:
        ev.gpu = gpu([p.pid for p in procs])
    except Exception as exc:  # noqa: BLE001 - a broken driver must not cost the rest of the evidence
        ev.gpu = gpu_state_mod.GpuState(False, note=f"GPU state failed: {type(exc).__name__}: {exc}")
    path = ev.folder / "gpu-state.json"
    path.write_text(json.dumps(ev.gpu.to_dict(), indent=1))
    ev.artifacts["gpu_state"] = str(path)
    if not ev.gpu.measured:
        ev.notes.append(f"GPU state: {ev.gpu.note or gpu_state_mod.NOT_MEASURED}")

    ev.seconds = time.monotonic() - t0
    if ev.notes:
        path = ev.folder / "evidence-notes.txt"
        path.write_text("\n".join(ev.notes) + "\n")
        ev.artifacts["evidence_notes"] = str(path)
    return ev
