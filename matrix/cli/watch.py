"""`soakmatrix watch`: guard a running vLLM server, catch a hang in seconds, keep the evidence.

    soakmatrix watch http://127.0.0.1:8000 --log /var/log/vllm.log --store history.db
    journalctl -fu vllm | soakmatrix watch http://127.0.0.1:8000 --log - --on-hang 'systemctl restart vllm'

The watch loop lives in jobs/watch/; this module parses the flags, prints what happens and stores
each incident in the history store as a run of kind "watch" (one run per incident, one result: the
watched server as a cell), so `soakmatrix report` and the dashboard show it beside soak findings.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from soakmatrix.matrix.arguments import DAY, duration, host, http_url, integer, pid, port, text
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.contracts.redact import redact_url, scrub, secret_values, url_secrets
from soakmatrix.matrix.lasting_stream import LastingStream, gone_from_the_start
from soakmatrix.matrix.paths import empty_store_warning, log_to_follow, output_dir, output_file

HELP = ("Attach to a running vLLM server (or the simulated one): poll /metrics, follow its log, send a tiny "
        "canary request when it is idle or its gauges cannot be trusted; on a hang keep the evidence "
        "(py-spy of its process tree, metrics, log tail, GPU state), classify it, run --on-hang, and keep watching.")
OUTLIVES_ITS_READER = True   # hours of work whose results are in files: a closed stderr does not end it

LOOPBACK = "127.0.0.1"   # the watch's metrics are for this machine unless the user says otherwise
CANARY_EVERY = duration(0.1, DAY, zero=True)
CANARY_TOKENS = integer(1, 4096)
HOOK_TIMEOUT = duration(1, DAY)
EVIDENCE_BUDGET = duration(1, 3600)
WATCH_FOR = duration(1, 3650 * DAY)       # 0 would watch nothing
MAX_INCIDENTS = integer(1, 1_000_000)
SILENCE = duration(0.5, DAY)              # a floor of 0 would call every pause a hang


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", type=http_url, help="the server's base URL, e.g. http://127.0.0.1:8000 (credentials in it are sent "
                                                    "as HTTP basic auth and never printed or stored; a query is not sent)")
    parser.add_argument("--pid", type=pid, help="the server's root pid (1 to the system's pid_max; default: the "
                                               "process listening on the URL's port)")
    parser.add_argument("--log", metavar="FILE|-", type=log_to_follow,
                        help="the server's log: a file (followed like tail -F; it may appear later) or - for stdin "
                             "(a FIFO too: --log - < FIFO)")
    parser.add_argument("--canary", metavar="EVERY", default="5s", type=CANARY_EVERY,
                        help="probe with a canary request when no progress was seen for this long "
                             f"({CANARY_EVERY.range_text}; default 5s; 0: never)")
    parser.add_argument("--canary-tokens", type=CANARY_TOKENS, default=4,
                        help=f"max_tokens of the canary ({CANARY_TOKENS.range_text}; default 4)")
    parser.add_argument("--model", type=text, help="model name for the canary (default: the first of /v1/models)")
    parser.add_argument("--on-hang", metavar="CMD", type=text,
                        help="shell command run after the evidence is kept; it gets SOAKMATRIX_EVIDENCE_DIR, "
                             "SOAKMATRIX_SIGNATURE, SOAKMATRIX_FINGERPRINT, SOAKMATRIX_OUTCOME, SOAKMATRIX_URL, ...")
    parser.add_argument("--on-hang-timeout", default="10m", metavar="DURATION", type=HOOK_TIMEOUT,
                        help=f"kill the hook after this ({HOOK_TIMEOUT.range_text}; default 10m)")
    parser.add_argument("--out", metavar="DIR", default="watch-incidents", type=output_dir,
                        help="evidence folders go here (default ./watch-incidents)")
    parser.add_argument("--store", metavar="FILE", type=output_file, help="history store (SQLite) to record incidents in")
    parser.add_argument("--metrics-port", type=port, help="serve the watch's own Prometheus metrics on this port "
                                                         f"({port.range_text})")
    parser.add_argument("--metrics-addr", default=LOOPBACK, type=host,
                        help=f"address for --metrics-port: an IP address or host name (default {LOOPBACK}, this "
                             "machine only; 0.0.0.0 serves every interface)")
    parser.add_argument("--evidence-budget", default="30s", metavar="DURATION", type=EVIDENCE_BUDGET,
                        help=f"time box for all of the evidence ({EVIDENCE_BUDGET.range_text}; default 30s)")
    parser.add_argument("--duration", metavar="DURATION", type=WATCH_FOR,
                        help=f"stop after this long ({WATCH_FOR.range_text}; default: until SIGTERM/SIGINT)")
    parser.add_argument("--max-incidents", type=MAX_INCIDENTS,
                        help=f"stop after this many incidents ({MAX_INCIDENTS.range_text})")
    parser.add_argument("--floor", default="6s", metavar="DURATION", type=SILENCE,
                        help=f"shortest silence under load that counts as a hang ({SILENCE.range_text}; default 6s; "
                             "learned upwards)")
    parser.add_argument("--ceiling", default="30s", metavar="DURATION", type=SILENCE,
                        help=f"longest silence the learned threshold may allow ({SILENCE.range_text}; default 30s)")


def main(args: argparse.Namespace) -> int:
    from soakmatrix.jobs.watch.incident import IncidentOptions
    from soakmatrix.jobs.watch.logsource import FileLog, StreamLog
    from soakmatrix.jobs.watch.loop import LoopConfig
    from soakmatrix.jobs.watch.metrics import WatchMetrics
    from soakmatrix.jobs.watch.runner import Watcher, WatchOptions
    from soakmatrix.jobs.watch.target import Target

    url, dropped = plain_url(args.url)
    try:
        target = Target(url, args.pid)
    except ValueError as exc:
        print(f"soakmatrix watch: {scrub(str(exc), url_secrets(args.url))}", file=sys.stderr)
        return EXIT_USAGE
    every, budget, hook_timeout = args.canary, args.evidence_budget, args.on_hang_timeout
    duration, floor, ceiling = args.duration, args.floor, args.ceiling
    if ceiling < floor:
        print("soakmatrix watch: --ceiling must not be below --floor", file=sys.stderr)
        return EXIT_USAGE
    warning = empty_store_warning("--store", args.store)
    if warning:
        print(f"soakmatrix watch: {warning}", file=sys.stderr)
    log = None
    if args.log == "-":
        log = StreamLog(sys.stdin)
    elif args.log:
        log = FileLog(args.log)
    metrics = WatchMetrics()
    try:
        metrics_server = metrics.serve(args.metrics_port, args.metrics_addr) if args.metrics_port else None
    except OSError as exc:   # the port is taken, or the host name does not resolve to this machine
        print(f"soakmatrix watch: --metrics-port {args.metrics_port}: cannot listen on {args.metrics_addr}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue   # nohup: meant to outlive its terminal
        signal.signal(sig, lambda *_: stop.set())

    # a watch beside production goes on when the reader of its notes goes away (matrix/lasting_stream.py)
    notes = gone_from_the_start(LastingStream(sys.stdout, Path(args.out) / "watch.log"), "stdout")

    # the URL's credentials and the API keys of the environment are used, never shown or kept
    secrets = url_secrets(args.url) + secret_values(env=dict(os.environ))

    def note(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} watch: {scrub(text, secrets)}", file=notes, flush=True)

    if dropped:
        note(f"the URL's {' and '.join(dropped)} {'are' if len(dropped) > 1 else 'is'} not sent: the watch's requests "
             f"(/metrics, /health, the canary) go to {target.display_url}")
    store = Path(args.store) if args.store else None
    watcher = Watcher(
        target, IncidentOptions(Path(args.out), budget_s=budget, on_hang=args.on_hang, on_hang_timeout_s=hook_timeout),
        log=log, metrics=metrics, on_note=note, on_incident=lambda incident: _store(store, incident, note),
        options=WatchOptions(loop=LoopConfig(canary_every_s=every), canary_tokens=args.canary_tokens,
                             model=args.model, threshold={"floor_s": floor, "ceiling_s": ceiling},
                             max_incidents=args.max_incidents))
    target.resolve()
    note(f"watching {target.describe()}; canary every {every:g} s when no progress; evidence to {args.out}"
         + (f"; metrics on {args.metrics_addr}:{args.metrics_port}" if args.metrics_port else ""))
    until = time.monotonic() + duration if duration is not None else None
    incidents = watcher.run(stop, until)
    for incident in incidents:
        if incident.hook is not None:
            incident.hook.join(timeout=hook_timeout)
    if metrics_server is not None:
        metrics_server.shutdown()
    note(f"stopped after {len(incidents)} incident(s)")
    return EXIT_FOUND if incidents else EXIT_OK


def plain_url(url: str) -> tuple[str, list[str]]:
    """The server's base URL as the watch requests it (`/metrics` and `/v1/...` are appended to it):
    without query or fragment, and what was left out, to say so. Credentials stay: the requests send
    them as HTTP basic auth (jobs/watch/bounded_http.py), and what is shown or kept masks them."""
    parts = urllib.parse.urlsplit(url)
    dropped = [what for what, there in (("query", bool(parts.query)), ("fragment", bool(parts.fragment))) if there]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), dropped


def _store(path: Path | None, incident, note) -> None:
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


def _record(path: Path, incident) -> str:
    from soakmatrix.reports.history import HistoryStore

    r = incident.result
    url = redact_url(str(r.extra.get("url", "")))
    r = dataclasses.replace(r, extra={**r.extra, "url": url})
    with HistoryStore(path) as store:
        run_id = store.start_run(matrix=url, profile="watch", kind="watch",
                                 meta={"host": socket.gethostname(), "pid": r.extra.get("pid"),
                                       "evidence_dir": str(incident.folder)})
        store.planned(run_id, [{"id": r.cell_id, "name": r.cell_name, "model": r.model, "gpu": r.gpu_type,
                                "flags": r.flags, "workload": r.workload}])
        store.record(run_id, r)
        store.finish_run(run_id, "finished")
    return run_id
