"""Stop a server's whole process tree and prove nothing of it remains.

SIGTERM to the process group, a grace period, then SIGKILL to the group and to every process of
the tree that left it. Then the check: no process of the tree alive, nothing listening on the
server's port, and (where NVML sees a GPU) no GPU memory held by our pids. A leak is not silence: it
is written to a leak file that `preflight()` reads before the next cell starts, which then becomes an
`infra_error` instead of a measurement on a dirty node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil


@dataclass
class TeardownReport:
    pids: list[int] = field(default_factory=list)  # every process of the tree we saw
    survivors: list[int] = field(default_factory=list)  # still alive after SIGKILL
    port_listening: bool = False
    gpu_pids: list[int] = field(default_factory=list)  # our pids still holding GPU memory
    escalated: bool = False  # SIGTERM was not enough
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.survivors and not self.port_listening and not self.gpu_pids

    def describe(self) -> str:
        if self.clean:
            return f"clean ({len(self.pids)} processes stopped{', after SIGKILL' if self.escalated else ''})"
        parts = []
        if self.survivors:
            parts.append(f"processes still alive: {self.survivors}")
        if self.port_listening:
            parts.append("port still listening")
        if self.gpu_pids:
            parts.append(f"GPU memory held by {self.gpu_pids}")
        return "leak: " + "; ".join(parts)


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (parents first)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error, OSError):
            continue
    return out


def teardown(server: Any, grace_s: float = 10.0, kill_wait_s: float = 5.0) -> TeardownReport:
    """Stop `server` (a RunningServer: .process, .pgid, .host, .port) and check what remains."""
    t0 = time.monotonic()
    report = TeardownReport()
    procs = {p.pid: p for p in [*tree(server.pid), *group_members(server.pgid)]}
    report.pids = sorted(procs)
    _signal_group(server.pgid, signal.SIGTERM)
    for p in procs.values():  # members that left the group (setsid'ed workers) get it too
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    _reap(server)
    # children may have been spawned while we waited
    late = [p for p in [*tree(server.pid), *group_members(server.pgid)] if p.pid not in procs]
    alive = [p for p in [*alive, *late] if _alive(p)]
    if alive:
        report.escalated = True
        _signal_group(server.pgid, signal.SIGKILL)
        for p in alive:
            _signal(p, signal.SIGKILL)
        _, alive = psutil.wait_procs(alive, timeout=kill_wait_s)
    _reap(server)
    report.pids = sorted({*report.pids, *(p.pid for p in late)})
    report.survivors = sorted(p.pid for p in alive if _alive(p))
    report.port_listening = port_listening(server.port, server.host, owners=report.pids)
    report.gpu_pids = sorted(set(gpu_memory_pids()) & set(report.pids))
    report.seconds = time.monotonic() - t0
    return report


def _reap(server: Any) -> None:
    try:
        server.process.wait(timeout=0.1)
    except subprocess.TimeoutExpired:  # still running: nothing to collect yet
        pass


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def port_listening(port: int, host: str = "127.0.0.1", owners: list[int] | None = None) -> bool:
    """Does anything still listen on the port? (listening sockets only, not TIME_WAIT leftovers.)
    With `owners`, only sockets of those pids (or of unknown owner) count: on a shared node another
    job may legitimately bind the same port number once ours is free."""
    try:
        for c in psutil.net_connections(kind="tcp"):
            if (
                c.status == psutil.CONN_LISTEN
                and c.laddr
                and c.laddr.port == port
                and (owners is None or c.pid is None or c.pid in owners)
            ):
                return True
        return False
    except (psutil.AccessDenied, PermissionError):
        import socket

        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex((host, port)) == 0


def gpu_memory_pids() -> list[int]:
    """Pids holding GPU memory per NVML; empty without a GPU or without pynvml."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML on this host: no GPU memory to hold
        return []
    pids: list[int] = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    pids.extend(p.pid for p in getattr(pynvml, getter)(handle))
                except Exception:  # noqa: BLE001 - a getter this driver lacks or refuses: the other may answer
                    continue
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the pids are read; a failed shutdown changes nothing
            pass
    return pids


# ---------------------------------------------------------------- leaks carried to the next cell


@dataclass(frozen=True)
class Leak:
    cell_id: str
    pids: list[int]
    port: int | None
    create_times: dict[str, float] = field(default_factory=dict)  # pid -> create time (pid reuse guard)
    at: float = field(default_factory=time.time)


def leak_file(state_dir: str | Path) -> Path:
    return Path(state_dir) / ".soak-leaks.json"


def record_leak(state_dir: str | Path, cell_id: str, report: TeardownReport, port: int | None) -> Leak:
    times = {}
    for pid in [*report.survivors, *report.gpu_pids]:
        try:
            times[str(pid)] = psutil.Process(pid).create_time()
        except psutil.Error:
            pass
    leak = Leak(cell_id, sorted({*report.survivors, *report.gpu_pids}), port if report.port_listening else None, times)
    path = leak_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    leaks = _read(path) + [asdict(leak)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(leaks))
    tmp.replace(path)
    return leak


def preflight(state_dir: str | Path) -> str | None:
    """Before a cell: a message if an earlier cell's leak is still there (an infra_error), else None.
    Leaks that have gone away since are forgotten."""
    path = leak_file(state_dir)
    leaks = _read(path)
    if not leaks:
        return None
    still: list[dict] = []
    problems: list[str] = []
    for leak in leaks:
        pids = [pid for pid in leak.get("pids", []) if _same_process(pid, leak.get("create_times", {}))]
        port = leak.get("port")
        port_busy = port_listening(int(port), owners=leak.get("pids") or None) if port else False
        if pids or port_busy:
            still.append(leak)
            what = ", ".join([*(f"pid {p}" for p in pids), *([f"port {port}"] if port_busy else [])])
            problems.append(f"cell {leak.get('cell_id')} left {what}")
    if still:
        path.write_text(json.dumps(still))
        return "node not clean: " + "; ".join(problems)
    path.unlink(missing_ok=True)
    return None


def _same_process(pid: int, create_times: dict) -> bool:
    try:
        p = psutil.Process(pid)
        if not _alive(p):
            return False
        expected = create_times.get(str(pid))
        return expected is None or abs(p.create_time() - expected) < 1.0
    except psutil.Error:
        return False


def _read(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, list) else []
    except (OSError, ValueError):
        return []
