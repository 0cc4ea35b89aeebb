"""Start an engine's server for one cell and wait until it serves.

`launch(engine, spec)` picks a free port on 127.0.0.1, starts the engine's `LaunchCommand` in its
own process group (so teardown can signal the whole tree) with stdout and stderr captured to
`<artifacts>/server.log`, and returns a `RunningServer`. Each server gets a private temp directory
(`<system temp>/soakmatrix-XXXXXXXX`) as its `TMPDIR` and `VLLM_RPC_BASE_PATH`, so vLLM's ZMQ IPC
sockets (`<uuid4>`) and torch.distributed's `vllm_dist_<uuid>` file land there and
`RunningServer.stop()` removes them with it; a `TMPDIR` or `VLLM_RPC_BASE_PATH` the cell's env or
the command sets wins (a `TMPDIR` set there is the server's own: it is neither replaced nor
deleted). Torch inductor's default cache (`<system temp>/torchinductor_<user>`: the CPU build's
150 MB precompiled headers, found through TMPDIR) stays shared: the private dir holds a symlink to
it. `RunningServer.wait_ready()` polls
`/v1/models`; a server that exits before it is ready with a usage error (exit code 2, an argparse
`error:` line, a rejected configuration) is a `config_error`, one that never comes up is an
`infra_error`; never a hang. The free port is picked before the server binds it, so another process
can take it first; when `/v1/models` answers from a listener that is not in the server's own process
tree, the start-up failed that race (an `infra_error` saying "Address already in use", which the soak
job retries on a new port), and is never taken for our server being ready.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.redact import redact_argv, redact_env

from .artifacts import PRIVATE_FILE, private_dir
from .engines.protocol import Engine, LaunchCommand
from .soak_spec import SoakSpec

HOST = "127.0.0.1"
# the private temp dir's prefix: short, so `<temp>/soakmatrix-XXXXXXXX/<uuid4>` stays far below the
# 107-byte limit of a unix socket path
TMP_PREFIX = "soakmatrix-"
# where vLLM puts its ZMQ IPC sockets (defaults to tempfile.gettempdir(), i.e. TMPDIR)
RPC_BASE_ENV = "VLLM_RPC_BASE_PATH"
# names the private temp dir in the server's environment, for whoever reaps a server whose
# RunningServer is gone (jobs/reaper.py, after a killed pytest worker or Ray worker)
OWNED_TMP_ENV = "SOAKMATRIX_TMPDIR"

# Lines that say the engine refused its flags (vLLM's argparse, its config validation, the sim's own).
CONFIG_ERROR_PATTERNS: list[re.Pattern] = [
    re.compile(r"^usage: ", re.M),
    re.compile(r"\berror: (?:argument|unrecognized arguments|the following arguments)"),
    re.compile(r"pydantic[\w.]*ValidationError|validation errors? for \w*Config"),
    re.compile(r"Unsupported speculative method|is not supported|not compatible with|is incompatible with"),
    re.compile(r"ValueError: .*(?:--[\w-]+|cudagraph|speculative|must be)"),
]
# Lines that say the node, not the flags, is at fault.
INFRA_ERROR_PATTERNS: list[re.Pattern] = [
    re.compile(r"[Aa]ddress already in use|EADDRINUSE"),
    re.compile(r"No CUDA GPUs are available|CUDA driver initialization failed|no NVIDIA driver"),
]


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class StartupFailure:
    outcome: Outcome
    message: str
    exit_code: int | None = None


def classify_startup_failure(exit_code: int | None, log_text: str, waited_s: float) -> StartupFailure:
    """Why a server never became ready: its exit code and log decide (pure)."""
    tail = "\n".join(log_text.splitlines()[-80:])
    if exit_code is None:
        return StartupFailure(Outcome.INFRA_ERROR, f"server not ready after {waited_s:.0f} s (still running)")
    for p in INFRA_ERROR_PATTERNS:
        if m := p.search(tail):
            return StartupFailure(
                Outcome.INFRA_ERROR, f"server exited ({exit_code}) at start-up: {_line_of(tail, m.start())}", exit_code
            )
    if exit_code == 2:
        return StartupFailure(
            Outcome.CONFIG_ERROR, f"engine rejected its flags (exit 2): {_last_error(tail)}", exit_code
        )
    for p in CONFIG_ERROR_PATTERNS:
        if m := p.search(tail):
            return StartupFailure(
                Outcome.CONFIG_ERROR,
                f"engine rejected its flags (exit {exit_code}): {_line_of(tail, m.start())}",
                exit_code,
            )
    return StartupFailure(
        Outcome.INFRA_ERROR, f"server exited ({exit_code}) before it was ready: {_last_error(tail)}", exit_code
    )


PORT_TAKEN = re.compile(r"[Aa]ddress already in use|EADDRINUSE")


def port_taken(failure: StartupFailure | None) -> bool:
    """The free port we picked was taken by someone else before the server bound it (a race)."""
    return failure is not None and failure.outcome is Outcome.INFRA_ERROR and bool(PORT_TAKEN.search(failure.message))


def listening_pids(port: int) -> set[int] | None:
    """The pids with a TCP socket listening on `port` (any address); None when the system does not
    say whose a listener is (another user's process, no access to the connection table)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError):
        return None
    pids = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    return {pid for pid in pids if pid is not None} if None not in pids else None


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()[:300]


def _last_error(tail: str) -> str:
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"error|Error|refus|invalid", line):
            return line[:300]
    return lines[-1][:300] if lines else "(no output)"


@dataclass
class RunningServer:
    """A started server: its process (own group), address and log."""

    process: subprocess.Popen
    host: str
    port: int
    log_path: Path
    command: LaunchCommand
    started_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    tmp_dir: Path | None = None  # the server's private TMPDIR, removed by stop(); None: the env's own
    _log_file: Any = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the server leads its own group

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def poll(self) -> int | None:
        return self.process.poll()

    def log_text(self, max_bytes: int = 256_000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 50) -> list[str]:
        return self.log_text().splitlines()[-lines:]

    def wait_ready(
        self,
        timeout_s: float,
        stop: threading.Event | None = None,
        probe: Callable[[str], bool] | None = None,
        interval_s: float = 0.5,
    ) -> StartupFailure | None:
        """Poll `/v1/models` until it answers; None when ready, else why not."""
        probe = probe or models_answer
        t0 = time.monotonic()
        while True:
            code = self.poll()
            if code is not None:
                time.sleep(0.2)  # let the last lines reach the log
                return classify_startup_failure(code, self.log_text(), time.monotonic() - t0)
            if probe(self.base_url):
                other = self.port_held_by_another()
                if other is not None:
                    return StartupFailure(
                        Outcome.INFRA_ERROR,
                        f"port {self.port} answered from pid {other}, not "
                        f"from this server: Address already in use (another process took the "
                        f"free port before the server bound it)",
                    )
                self.ready_at = time.time()
                return None
            if stop is not None and stop.is_set():
                return StartupFailure(Outcome.INFRA_ERROR, "cancelled")
            if time.monotonic() - t0 > timeout_s:
                return classify_startup_failure(None, self.log_text(), time.monotonic() - t0)
            (stop.wait(interval_s) if stop is not None else time.sleep(interval_s))

    def port_held_by_another(self) -> int | None:
        """A pid outside the server's process tree that listens on its port while no process of the
        tree does: what answers there is not this server. None when the tree holds the port, or when
        the system does not say."""
        owners = listening_pids(self.port)
        if not owners:
            return None
        try:
            tree = {self.pid} | {c.pid for c in psutil.Process(self.pid).children(recursive=True)}
        except psutil.Error:
            tree = {self.pid}
        return None if owners & tree else min(owners)

    def stop(self, grace_s: float = 10.0):
        """Tear the whole process group down (see teardown.py); returns the teardown report."""
        from .teardown import teardown

        try:
            report = teardown(self, grace_s=grace_s)
        finally:
            self.close_log()
            self.remove_tmp_dir()
        return report

    def remove_tmp_dir(self) -> None:
        """Delete the private temp dir (IPC sockets, vllm_dist files) once the server is down."""
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def close_log(self) -> None:
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def models_answer(base_url: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start(
    command: LaunchCommand, artifacts_dir: str | Path, host: str, port: int, extra_env: Mapping[str, str] | None = None
) -> RunningServer:
    """Start `command` in a new session (own process group), output appended to server.log, with a
    private TMPDIR (see the module docstring) unless the cell's env or the command sets one."""
    folder = private_dir(artifacts_dir)
    log_path = folder / "server.log"
    explicit = {**dict(extra_env or {}), **dict(command.env)}
    env = {**os.environ, **explicit, "PYTHONUNBUFFERED": "1"}
    env.pop(OWNED_TMP_ENV, None)  # inherited from a server that started us: not ours to delete
    tmp_dir: Path | None = None
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
    log_file = os.fdopen(log_fd, "ab", buffering=0)
    try:
        if "TMPDIR" not in explicit:
            tmp_dir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
            _share_inductor_cache(tmp_dir)
            env["TMPDIR"] = env[OWNED_TMP_ENV] = str(tmp_dir)
            if RPC_BASE_ENV not in explicit:
                env[RPC_BASE_ENV] = str(tmp_dir)
        process = subprocess.Popen(
            list(command.argv),
            env=env,
            cwd=command.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        at_normal_priority(process.pid)
    except BaseException:
        log_file.close()
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return RunningServer(process, host, port, log_path, command, tmp_dir=tmp_dir, _log_file=log_file)


def at_normal_priority(pid: int) -> None:
    """Niceness 0 for the engine, where this process may raise a priority (root, CAP_SYS_NICE).

    Ray starts its workers at niceness 15 (so that its own daemons stay responsive) and a server
    started by a soak job inherits it: an engine that the node's other work starves stalls as a hung
    one does, and production runs `vllm serve` at 0. Set right after the start, before the server
    spawns its engine core and workers, which inherit it. Without the right the niceness stays."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) > 0:
            os.setpriority(os.PRIO_PROCESS, pid, 0)
    except OSError:
        pass


def _share_inductor_cache(tmp_dir: Path) -> None:
    """`<tmp_dir>/torchinductor_<user>` -> the system temp dir's: torch finds its default cache (the
    CPU build's precompiled headers, 150 MB each) under TMPDIR, and a private TMPDIR would rebuild
    them for every server and delete them with it. rmtree removes the link, not the cache."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    name = "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)  # torch's default_cache_dir()
    shared = Path(tempfile.gettempdir()) / name
    try:
        shared.mkdir(exist_ok=True)
        (tmp_dir / name).symlink_to(shared, target_is_directory=True)
    except OSError:
        pass  # then the server has a cache of its own, removed with it


def launch(engine: Engine, spec: SoakSpec, host: str = HOST, port: int | None = None) -> RunningServer:
    """Start `engine`'s server for `spec` on a free port (not yet ready: call `wait_ready`)."""
    port = port or free_port(host)
    command = engine.command(spec, host, port)
    private_dir(spec.artifacts_dir)
    # what a maintainer pastes to reproduce: the cell's own environment, then the argv, secrets masked
    env = redact_env({**dict(spec.env), **dict(command.env)})
    prefix = "".join(f"{k}={_quote(str(v))} " for k, v in sorted(env.items()))
    line = prefix + " ".join(_quote(a) for a in redact_argv(command.argv)) + "\n"
    fd = os.open(Path(spec.artifacts_dir) / "command.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as handle:
        handle.write(line)
    return start(command, spec.artifacts_dir, host, port, extra_env=spec.env)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def launch_argv(
    argv: Sequence[str], artifacts_dir: str | Path, port: int, host: str = HOST, env: Mapping[str, str] | None = None
) -> RunningServer:
    """Start an arbitrary server command (tests, the pytest plugin) under the same lifecycle."""
    return start(LaunchCommand(list(argv), dict(env or {})), artifacts_dir, host, port)
