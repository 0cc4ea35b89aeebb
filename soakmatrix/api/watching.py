"""Watching a production server: `watch(url, ...)` guards a running vLLM server (or the simulated one),
catches a hang in seconds, keeps the evidence and records each incident; `simulated_server()` starts
the simulated vLLM server to try it on.

The loop lives in jobs/watch/: it polls /metrics, follows the log, sends a tiny canary request when
the server is idle or its gauges cannot be trusted; on a hang it keeps the evidence (py-spy of the
process tree, metrics, log tail, GPU state), classifies it and runs `on_hang`. With a store, each
incident is a run of kind "watch" whose one cell is the watched server. Answers a `WatchResult`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from .errors import UsageError
from .types import WatchResult

LOOPBACK = "127.0.0.1"  # the watch's metrics are for this machine unless the user says otherwise


def watch(
    url: str,
    *,
    pid: int | None = None,
    log: str | Path | TextIO | None = None,
    canary_every_s: float = 5.0,
    canary_tokens: int = 4,
    model: str | None = None,
    on_hang: str | None = None,
    on_hang_timeout_s: float = 600.0,
    out: str | Path = "watch-incidents",
    store: str | Path | None = None,
    metrics_port: int | None = None,
    metrics_addr: str = LOOPBACK,
    evidence_budget_s: float = 30.0,
    duration_s: float | None = None,
    max_incidents: int | None = None,
    floor_s: float = 6.0,
    ceiling_s: float = 30.0,
    stop: threading.Event | None = None,
    on_note: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> WatchResult:
    """Watch the server at `url` until `duration_s` passed, `max_incidents` were caught or `stop` is set.

    `log`: the server's log, a file followed like tail -F, or a stream read line by line; `on_hang`: a
    shell command run after the evidence is kept (SOAKMATRIX_EVIDENCE_DIR, SOAKMATRIX_SIGNATURE, ...);
    `canary_every_s`: probe when no progress was seen for this long (0: never); `floor_s`/`ceiling_s`:
    the shortest silence under load that is a hang, and the most the learned threshold may allow.
    `on_note(line)` hears what the watch says (credentials of the URL and API keys scrubbed). Raises
    UsageError for a URL, pid or metrics port that cannot be used."""
    from soakmatrix.jobs.watch.incident import IncidentOptions
    from soakmatrix.jobs.watch.logsource import FileLog, StreamLog
    from soakmatrix.jobs.watch.loop import LoopConfig
    from soakmatrix.jobs.watch.metrics import WatchMetrics
    from soakmatrix.jobs.watch.runner import Watcher, WatchOptions
    from soakmatrix.jobs.watch.target import Target
    from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_OK
    from soakmatrix.matrix.contracts.redact import scrub, secret_values, url_secrets
    from soakmatrix.matrix.paths import empty_store_warning

    base, dropped = plain_url(url)
    try:
        target = Target(base, pid)
    except ValueError as exc:
        raise UsageError(scrub(str(exc), url_secrets(url))) from None
    if ceiling_s < floor_s:
        raise UsageError("--ceiling must not be below --floor")
    if store is not None:
        warning = empty_store_warning("--store", str(store))
        if warning:
            (warn or _warn)(warning)
    source: FileLog | StreamLog | None = None
    if isinstance(log, (str, Path)):
        source = FileLog(str(log))
    elif log is not None:
        source = StreamLog(log)
    metrics = WatchMetrics()
    try:
        metrics_server = metrics.serve(metrics_port, metrics_addr) if metrics_port else None
    except OSError as exc:  # the port is taken, or the host name does not resolve to this machine
        raise UsageError(
            f"--metrics-port {metrics_port}: cannot listen on {metrics_addr}: {exc.strerror or exc}"
        ) from None
    # the URL's credentials and the API keys of the environment are used, never shown or kept
    secrets = url_secrets(url) + secret_values(env=dict(os.environ))
    notes: list[str] = []

    def note(text: str) -> None:
        line = scrub(text, secrets)
        notes.append(line)
        if on_note is not None:
            on_note(line)

    if dropped:
        note(
            f"the URL's {' and '.join(dropped)} {'are' if len(dropped) > 1 else 'is'} not sent: the watch's requests "
            f"(/metrics, /health, the canary) go to {target.display_url}"
        )
    store_path = Path(store) if store is not None else None
    watcher = Watcher(
        target,
        IncidentOptions(Path(out), budget_s=evidence_budget_s, on_hang=on_hang, on_hang_timeout_s=on_hang_timeout_s),
        log=source,
        metrics=metrics,
        on_note=note,
        on_incident=lambda incident: _store(store_path, incident, note),
        options=WatchOptions(
            loop=LoopConfig(canary_every_s=canary_every_s),
            canary_tokens=canary_tokens,
            model=model,
            threshold={"floor_s": floor_s, "ceiling_s": ceiling_s},
            max_incidents=max_incidents,
        ),
    )
    target.resolve()
    note(
        f"watching {target.describe()}; canary every {canary_every_s:g} s when no progress; evidence to {out}"
        + (f"; metrics on {metrics_addr}:{metrics_port}" if metrics_port else "")
    )
    until = time.monotonic() + duration_s if duration_s is not None else None
    incidents = watcher.run(stop or threading.Event(), until)
    for incident in incidents:
        if incident.hook is not None:
            incident.hook.join(timeout=on_hang_timeout_s)
    if metrics_server is not None:
        metrics_server.shutdown()
    note(f"stopped after {len(incidents)} incident(s)")
    return WatchResult(EXIT_FOUND if incidents else EXIT_OK, tuple(incidents), tuple(notes))


def _warn(line: str) -> None:
    import warnings

    warnings.warn(line, stacklevel=3)


def plain_url(url: str) -> tuple[str, list[str]]:
    """The server's base URL as the watch requests it (`/metrics` and `/v1/...` are appended to it):
    without query or fragment, and what was left out, to say so. Credentials stay: the requests send
    them as HTTP basic auth (jobs/watch/bounded_http.py), and what is shown or kept masks them."""
    parts = urllib.parse.urlsplit(url)
    dropped = [what for what, there in (("query", bool(parts.query)), ("fragment", bool(parts.fragment))) if there]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), dropped


def _store(path: Path | None, incident: Any, note: Callable[[str], None]) -> None:
    """One run of kind "watch" per incident: the watched server is its only cell."""
    if path is None:
        return
    from soakmatrix.reports.history import StoreError

    try:
        run_id = _record(path, incident)
    except (StoreError, OSError, sqlite3.Error) as exc:
        # a full disk or a broken store costs the record, never the watch: the evidence folder stands
        note(f"could not record the incident in {path}: {exc}; its evidence is in {incident.folder}")
        return
    note(f"recorded in {path} as run {run_id}")


def _record(path: Path, incident: Any) -> str:
    from soakmatrix.matrix.contracts.redact import redact_url
    from soakmatrix.reports.history import HistoryStore

    r = incident.result
    url = redact_url(r.url)
    r = dataclasses.replace(r, url=url)
    with HistoryStore(path) as store:
        run_id = store.start_run(
            matrix=url,
            profile="watch",
            kind="watch",
            meta={"host": socket.gethostname(), "pid": r.pid, "evidence_dir": str(incident.folder)},
        )
        store.planned(
            run_id,
            [
                {
                    "id": r.cell_id,
                    "name": r.cell_name,
                    "model": r.model,
                    "gpu": r.gpu_type,
                    "flags": r.flags,
                    "workload": r.workload,
                }
            ],
        )
        store.record(run_id, r)
        store.finish_run(run_id, "finished")
    return run_id


class SimulatedServer:
    """The simulated vLLM server (`soakmatrix sim-engine`) in a process of its own, on 127.0.0.1 at a
    free port: `url`, `stop()`. As a context manager it is started and stopped."""

    def __init__(self, args: tuple[str, ...] = (), log: str | Path = "sim-engine.log", model: str = "sim-model"):
        from soakmatrix.fixtures.sim_testing import SimProcess

        self._process = SimProcess(list(args), log, model=model)
        self.url: str = self._process.url
        self.log = Path(log)

    def start(self, ready_timeout_s: float = 30.0) -> SimulatedServer:
        self._process.start(ready_timeout_s)
        return self

    def stop(self) -> None:
        self._process.stop()

    def __enter__(self) -> SimulatedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def simulated_server(*args: str, log: str | Path = "sim-engine.log", model: str = "sim-model") -> SimulatedServer:
    """The simulated server, not yet started (`with simulated_server("--hang-after", "30") as sim:`);
    `args` are `vllm serve` flags and the simulator's own (`soakmatrix sim-engine --help`)."""
    return SimulatedServer(tuple(args), log, model)
