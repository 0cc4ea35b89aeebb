"""The watched server: its URL, and its processes found from `--pid` or from the port's listener.

After a restart the pid we were given is gone; the process now listening on the URL's port takes its
place. Listing another user's sockets needs privileges (psutil raises AccessDenied): then the pid
comes from `--pid` or not at all, and the evidence says so. `proc_snapshot` is what can still be read
about a process when ptrace (py-spy) is not permitted: /proc status, wait channel, threads.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import psutil

from soakmatrix.jobs.teardown import tree
from soakmatrix.matrix.contracts.redact import redact_text

NO_PID = 2**31 - 1  # never a live pid: evidence capture finds no tree for it


class Target:
    def __init__(self, url: str, pid: int | None = None) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.base_url = url.rstrip("/")
        self.display_url = redact_text(self.base_url)  # what is printed, stored or handed to a hook
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.given_pid = pid
        self.pid: int | None = pid
        self.problem: str | None = None  # why no pid could be found

    def resolve(self) -> int | None:
        """The server's root pid now: the given one while it lives, else the port's listener."""
        if self.pid is not None and psutil.pid_exists(self.pid):
            return self.pid
        pid, self.problem = listener_pid(self.port)
        self.pid = pid
        return pid

    def processes(self) -> list[psutil.Process]:
        return tree(self.pid) if self.pid is not None else []

    def describe(self) -> str:
        if self.pid is None:
            return f"{self.display_url} (no process found: {self.problem or 'not resolved yet'})"
        names = []
        for p in self.processes():
            try:
                names.append(f"{p.pid} {p.name()}")
            except psutil.Error:
                continue
        return f"{self.display_url} (pid {self.pid}; tree: {', '.join(names) or 'gone'})"

    def poll(self) -> int | None:
        """The watchdog's exit-code probe: we did not start the server, so we never know its code."""
        return None


def listener_pid(port: int) -> tuple[int | None, str | None]:
    """The pid listening on `port` (any address), and why not when it cannot be told."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError):
        return None, "listing sockets needs privileges (run as the server's user or root, or give --pid)"
    owners = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    known = sorted(p for p in owners if p is not None)
    if known:
        # several listeners (SO_REUSEPORT workers): the eldest is the root of the tree
        return min(known, key=_create_time), None
    if owners:
        return None, f"port {port} is listened on by a process we may not see (another user or namespace)"
    return None, f"nothing listens on port {port} on this host"


def _create_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return float("inf")


def proc_snapshot(pid: int) -> dict[str, Any]:
    """What /proc tells without ptrace: state, wait channel, threads with their states and CPU times."""
    out: dict[str, Any] = {"pid": pid}
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            out.update(
                name=p.name(),
                status=p.status(),
                cmdline=p.cmdline()[:8],
                num_threads=p.num_threads(),
                cpu_times=p.cpu_times()._asdict(),
                memory_rss=p.memory_info().rss,
            )
        threads = []
        for t in p.threads():
            entry: dict[str, Any] = {"tid": t.id, "user_s": t.user_time, "system_s": t.system_time}
            entry.update(_proc_fields(Path(f"/proc/{pid}/task/{t.id}")))
            threads.append(entry)
        out["threads"] = threads
    except psutil.Error as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out.update(_proc_fields(Path(f"/proc/{pid}")))
    return out


def _proc_fields(base: Path) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in ("wchan", "comm"):
        try:
            fields[name] = (base / name).read_text().strip()
        except OSError:
            pass
    try:
        status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines() if ":" in line)
        fields["state"] = status.get("State", "").strip()
    except OSError:
        pass
    try:  # the kernel stack: root only
        fields["kernel_stack"] = (base / "stack").read_text().splitlines()[:20]
    except OSError:
        pass
    return fields
