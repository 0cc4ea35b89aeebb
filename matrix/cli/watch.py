"""`soakmatrix watch`: guard a running vLLM server, catch a hang in seconds, keep the evidence.

    soakmatrix watch http://127.0.0.1:8000 --log /var/log/vllm.log --store history.db
    journalctl -fu vllm | soakmatrix watch http://127.0.0.1:8000 --log - --on-hang 'systemctl restart vllm'

The API's `soakmatrix.watch` watches (the loop lives in jobs/watch/) and stores each incident in the
history store as a run of kind "watch" (one run per incident, one result: the watched server as a
cell), so `soakmatrix report` and the dashboard show it beside soak findings; this module parses the
flags, stops the watch on SIGTERM/SIGINT/SIGHUP and prints what happens.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from soakmatrix.api.watching import LOOPBACK
from soakmatrix.matrix.arguments import DAY, duration, host, http_url, integer, pid, port, text
from soakmatrix.matrix.contracts.outcomes import EXIT_USAGE
from soakmatrix.matrix.lasting_stream import LastingStream, gone_from_the_start
from soakmatrix.matrix.paths import log_to_follow, output_dir, output_file

HELP = (
    "Attach to a running vLLM server (or the simulated one): poll /metrics, follow its log, send a tiny "
    "canary request when it is idle or its gauges cannot be trusted; on a hang keep the evidence "
    "(py-spy of its process tree, metrics, log tail, GPU state), classify it, run --on-hang, and keep watching."
)
OUTLIVES_ITS_READER = True  # hours of work whose results are in files: a closed stderr does not end it

CANARY_EVERY = duration(0.1, DAY, zero=True)
CANARY_TOKENS = integer(1, 4096)
HOOK_TIMEOUT = duration(1, DAY)
EVIDENCE_BUDGET = duration(1, 3600)
WATCH_FOR = duration(1, 3650 * DAY)  # 0 would watch nothing
MAX_INCIDENTS = integer(1, 1_000_000)
SILENCE = duration(0.5, DAY)  # a floor of 0 would call every pause a hang


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        type=http_url,
        help="the server's base URL, e.g. http://127.0.0.1:8000 (credentials in it are sent "
        "as HTTP basic auth and never printed or stored; a query is not sent)",
    )
    parser.add_argument(
        "--pid",
        type=pid,
        help="the server's root pid (1 to the system's pid_max; default: the process listening on the URL's port)",
    )
    parser.add_argument(
        "--log",
        metavar="FILE|-",
        type=log_to_follow,
        help="the server's log: a file (followed like tail -F; it may appear later) or - for stdin "
        "(a FIFO too: --log - < FIFO)",
    )
    parser.add_argument(
        "--canary",
        metavar="EVERY",
        default="5s",
        type=CANARY_EVERY,
        help="probe with a canary request when no progress was seen for this long "
        f"({CANARY_EVERY.range_text}; default 5s; 0: never)",
    )
    parser.add_argument(
        "--canary-tokens",
        type=CANARY_TOKENS,
        default=4,
        help=f"max_tokens of the canary ({CANARY_TOKENS.range_text}; default 4)",
    )
    parser.add_argument("--model", type=text, help="model name for the canary (default: the first of /v1/models)")
    parser.add_argument(
        "--on-hang",
        metavar="CMD",
        type=text,
        help="shell command run after the evidence is kept; it gets SOAKMATRIX_EVIDENCE_DIR, "
        "SOAKMATRIX_SIGNATURE, SOAKMATRIX_FINGERPRINT, SOAKMATRIX_OUTCOME, SOAKMATRIX_URL, ...",
    )
    parser.add_argument(
        "--on-hang-timeout",
        default="10m",
        metavar="DURATION",
        type=HOOK_TIMEOUT,
        help=f"kill the hook after this ({HOOK_TIMEOUT.range_text}; default 10m)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="watch-incidents",
        type=output_dir,
        help="evidence folders go here (default ./watch-incidents)",
    )
    parser.add_argument(
        "--store", metavar="FILE", type=output_file, help="history store (SQLite) to record incidents in"
    )
    parser.add_argument(
        "--metrics-port", type=port, help=f"serve the watch's own Prometheus metrics on this port ({port.range_text})"
    )
    parser.add_argument(
        "--metrics-addr",
        default=LOOPBACK,
        type=host,
        help=f"address for --metrics-port: an IP address or host name (default {LOOPBACK}, this "
        "machine only; 0.0.0.0 serves every interface)",
    )
    parser.add_argument(
        "--evidence-budget",
        default="30s",
        metavar="DURATION",
        type=EVIDENCE_BUDGET,
        help=f"time box for all of the evidence ({EVIDENCE_BUDGET.range_text}; default 30s)",
    )
    parser.add_argument(
        "--duration",
        metavar="DURATION",
        type=WATCH_FOR,
        help=f"stop after this long ({WATCH_FOR.range_text}; default: until SIGTERM/SIGINT)",
    )
    parser.add_argument(
        "--max-incidents", type=MAX_INCIDENTS, help=f"stop after this many incidents ({MAX_INCIDENTS.range_text})"
    )
    parser.add_argument(
        "--floor",
        default="6s",
        metavar="DURATION",
        type=SILENCE,
        help=f"shortest silence under load that counts as a hang ({SILENCE.range_text}; default 6s; learned upwards)",
    )
    parser.add_argument(
        "--ceiling",
        default="30s",
        metavar="DURATION",
        type=SILENCE,
        help=f"longest silence the learned threshold may allow ({SILENCE.range_text}; default 30s)",
    )


def main(args: argparse.Namespace) -> int:
    from soakmatrix.api.errors import UsageError
    from soakmatrix.api.watching import watch

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue  # nohup: meant to outlive its terminal
        signal.signal(sig, lambda *_: stop.set())
    notes: list[LastingStream] = []

    def note(text: str) -> None:
        if not notes:  # a watch beside production goes on when the reader of its notes goes away
            notes.append(gone_from_the_start(LastingStream(sys.stdout, Path(args.out) / "watch.log"), "stdout"))
        print(f"{time.strftime('%H:%M:%S')} watch: {text}", file=notes[0], flush=True)

    try:
        watched = watch(
            args.url,
            pid=args.pid,
            log=sys.stdin if args.log == "-" else args.log,
            canary_every_s=args.canary,
            canary_tokens=args.canary_tokens,
            model=args.model,
            on_hang=args.on_hang,
            on_hang_timeout_s=args.on_hang_timeout,
            out=args.out,
            store=args.store,
            metrics_port=args.metrics_port,
            metrics_addr=args.metrics_addr,
            evidence_budget_s=args.evidence_budget,
            duration_s=args.duration,
            max_incidents=args.max_incidents,
            floor_s=args.floor,
            ceiling_s=args.ceiling,
            stop=stop,
            on_note=note,
            warn=lambda line: print(f"soakmatrix watch: {line}", file=sys.stderr),
        )
    except UsageError as exc:
        print(f"soakmatrix watch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return watched.exit_code
