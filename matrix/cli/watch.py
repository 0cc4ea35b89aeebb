"""`soakmatrix watch`: guard a running vLLM server, catch a hang in seconds, keep the evidence.

    soakmatrix watch http://127.0.0.1:8000 --log /var/log/vllm.log --store history.db
    journalctl -fu vllm | soakmatrix watch http://127.0.0.1:8000 --log - --on-hang 'systemctl restart vllm'

The watch loop lives in jobs/watch/; this module parses the flags, prints what happens and stores
each incident in the history store as a run of kind "watch" (one run per incident, one result: the
watched server as a cell), so `soakmatrix report` and the dashboard show it beside soak findings.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from soakmatrix.matrix.contracts.durations import parse_duration
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.lasting_stream import LastingStream, gone_from_the_start

HELP = ("Attach to a running vLLM server (or the simulated one): poll /metrics, follow its log, send a tiny "
        "canary request when it is idle or its gauges cannot be trusted; on a hang keep the evidence "
        "(py-spy of its process tree, metrics, log tail, GPU state), classify it, run --on-hang, and keep watching.")
OUTLIVES_ITS_READER = True   # hours of work whose results are in files: a closed stderr does not end it


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--pid", type=int, help="the server's root pid (default: the process listening on the URL's port)")
    parser.add_argument("--log", metavar="FILE|-", help="the server's log: a file (followed like tail -F) or - for stdin")
    parser.add_argument("--canary", metavar="EVERY", default="5s",
                        help="probe with a canary request when no progress was seen for this long (default 5s; 0: never)")
    parser.add_argument("--canary-tokens", type=int, default=4, help="max_tokens of the canary (default 4)")
    parser.add_argument("--model", help="model name for the canary (default: the first of /v1/models)")
    parser.add_argument("--on-hang", metavar="CMD",
                        help="shell command run after the evidence is kept; it gets SOAKMATRIX_EVIDENCE_DIR, "
                             "SOAKMATRIX_SIGNATURE, SOAKMATRIX_FINGERPRINT, SOAKMATRIX_OUTCOME, SOAKMATRIX_URL, ...")
    parser.add_argument("--on-hang-timeout", default="10m", metavar="DURATION", help="kill the hook after this (default 10m)")
    parser.add_argument("--out", metavar="DIR", default="watch-incidents", help="evidence folders go here (default ./watch-incidents)")
    parser.add_argument("--store", metavar="FILE", help="history store (SQLite) to record incidents in")
    parser.add_argument("--metrics-port", type=int, help="serve the watch's own Prometheus metrics on this port")
    parser.add_argument("--metrics-addr", default="0.0.0.0", help="address for --metrics-port (default 0.0.0.0)")
    parser.add_argument("--evidence-budget", default="30s", metavar="DURATION",
                        help="time box for all of the evidence (default 30s)")
    parser.add_argument("--duration", metavar="DURATION", help="stop after this long (default: until SIGTERM/SIGINT)")
    parser.add_argument("--max-incidents", type=int, help="stop after this many incidents")
    parser.add_argument("--floor", default="6s", metavar="DURATION",
                        help="shortest silence under load that counts as a hang (default 6s; learned upwards)")
    parser.add_argument("--ceiling", default="30s", metavar="DURATION",
                        help="longest silence the learned threshold may allow (default 30s)")


def main(args: argparse.Namespace) -> int:
    from soakmatrix.jobs.watch.incident import IncidentOptions
    from soakmatrix.jobs.watch.logsource import FileLog, StreamLog
    from soakmatrix.jobs.watch.loop import LoopConfig
    from soakmatrix.jobs.watch.metrics import WatchMetrics
    from soakmatrix.jobs.watch.runner import Watcher, WatchOptions
    from soakmatrix.jobs.watch.target import Target

    try:
        target = Target(args.url, args.pid)
        every = parse_duration(args.canary)
        budget, hook_timeout = parse_duration(args.evidence_budget), parse_duration(args.on_hang_timeout)
        duration = parse_duration(args.duration) if args.duration else None
        floor, ceiling = parse_duration(args.floor), parse_duration(args.ceiling)
    except ValueError as exc:
        print(f"soakmatrix watch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if ceiling < floor:
        print("soakmatrix watch: --ceiling must not be below --floor", file=sys.stderr)
        return EXIT_USAGE
    log = None
    if args.log == "-":
        log = StreamLog(sys.stdin)
    elif args.log:
        log = FileLog(args.log)
    metrics = WatchMetrics()
    metrics_server = metrics.serve(args.metrics_port, args.metrics_addr) if args.metrics_port else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue   # nohup: meant to outlive its terminal
        signal.signal(sig, lambda *_: stop.set())

    # a watch beside production goes on when the reader of its notes goes away (matrix/lasting_stream.py)
    notes = gone_from_the_start(LastingStream(sys.stdout, Path(args.out) / "watch.log"), "stdout")

    def note(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} watch: {text}", file=notes, flush=True)

    store = Path(args.store) if args.store else None
    watcher = Watcher(
        target, IncidentOptions(Path(args.out), budget_s=budget, on_hang=args.on_hang, on_hang_timeout_s=hook_timeout),
        log=log, metrics=metrics, on_note=note, on_incident=lambda incident: _store(store, incident, note),
        options=WatchOptions(loop=LoopConfig(canary_every_s=every), canary_tokens=args.canary_tokens,
                             model=args.model, threshold={"floor_s": floor, "ceiling_s": ceiling},
                             max_incidents=args.max_incidents))
    target.resolve()
    note(f"watching {target.describe()}; canary every {every:g} s when no progress; evidence to {args.out}"
         + (f"; metrics on :{args.metrics_port}" if args.metrics_port else ""))
    until = time.monotonic() + duration if duration is not None else None
    incidents = watcher.run(stop, until)
    for incident in incidents:
        if incident.hook is not None:
            incident.hook.join(timeout=hook_timeout)
    if metrics_server is not None:
        metrics_server.shutdown()
    note(f"stopped after {len(incidents)} incident(s)")
    return EXIT_FOUND if incidents else EXIT_OK


def _store(path: Path | None, incident, note) -> None:
    """One run of kind "watch" per incident: the watched server is its only cell."""
    if path is None:
        return
    from soakmatrix.reports.history import HistoryStore

    r = incident.result
    with HistoryStore(path) as store:
        run_id = store.start_run(matrix=str(r.extra.get("url", "")), profile="watch", kind="watch",
                                 meta={"host": socket.gethostname(), "pid": r.extra.get("pid"),
                                       "evidence_dir": str(incident.folder)})
        store.planned(run_id, [{"id": r.cell_id, "name": r.cell_name, "model": r.model, "gpu": r.gpu_type,
                                "flags": r.flags, "workload": r.workload}])
        store.record(run_id, r)
        store.finish_run(run_id, "finished")
    note(f"recorded in {path} as run {run_id}")
