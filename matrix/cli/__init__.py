"""The `soakmatrix` command: a thin dispatcher over one module per subcommand.

Each command module has `HELP`, `configure(parser)` and `main(args) -> int`; it is imported only
when its command runs, so `soakmatrix plan` never pays for Ray or vLLM imports. A command that
needs an optional extra (Ray, the dashboard, bisection's statistics: `NEEDS`, matrix/extras.py) says
which to install and exits 2 when it is missing, before it starts any work. A module that sets
`ACCEPTS_UNKNOWN_ARGS = True` gets the arguments its parser did not know in `args.unknown_args`;
one that sets `OUTLIVES_ITS_READER = True` runs with stderr as a `LastingStream`, so that a reader
of its progress going away does not end hours of work (matrix/lasting_stream.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from soakmatrix.matrix import extras
from soakmatrix.matrix.contracts.outcomes import EXIT_INFRA, EXIT_USAGE
from soakmatrix.matrix.contracts.yamlsrc import SpecError
from soakmatrix.matrix.lasting_stream import LastingStream, gone_from_the_start, reopen_closed_standard_streams
from soakmatrix.matrix.stop_signals import EXIT_FOR, Stopped, signal_name

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("soakmatrix.matrix.cli.plan", "show the cells a matrix profile will run, their argv and cost"),
    "run": ("soakmatrix.matrix.cli.run", "run a matrix profile on Ray (local cluster by default)"),
    "smoke": ("soakmatrix.matrix.cli.smoke", "the pull-request smoke matrix: t-way, short, budgeted"),
    "bisect": ("soakmatrix.matrix.cli.bisect", "find the smallest set of flags that still hangs"),
    "report": ("soakmatrix.matrix.cli.report", "write JUnit and the dashboard from a history store"),
    "sim-engine": ("soakmatrix.matrix.cli.sim_engine", "the simulated vLLM server (takes `vllm serve` flags)"),
    "watch": ("soakmatrix.matrix.cli.watch", "guard a running vLLM server: catch a hang in seconds, keep the evidence"),
    "doctor": ("soakmatrix.matrix.cli.doctor", "check this node can run cells: GPUs, NVML, ptrace, shm, vLLM, Xid"),
}

# the extras (matrix/extras.py) a command needs whatever its options; the core runs the others.
# `bisect` needs Ray only for real probes: the cluster connection checks for it (--virtual needs none).
NEEDS: dict[str, tuple[str, ...]] = {
    "run": ("ray", "reports"),
    "smoke": ("ray", "reports"),
    "bisect": ("bisect",),
    "report": ("reports",),
}


def version_line() -> str:
    import soakmatrix

    return f"soakmatrix {soakmatrix.__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="soakmatrix", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    reopen_closed_standard_streams()  # first: before any file could take descriptor 1 or 2
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--version":
        print(version_line())
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if not argv or argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0 if argv else EXIT_USAGE
        parser.error(f"unknown command {argv[0]!r}")
    name, rest = argv[0], argv[1:]
    # everything we write (cells' artifacts, JUnit, the store, the dashboard) is the user's alone:
    # logs and evidence can hold what a secret-scrubber does not know to look for
    os.umask(0o077)
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ImportError as exc:
        # a command module whose own imports need the extra (its --help too)
        missing = extras.from_import_error(exc, among=NEEDS.get(name, ()))
        if missing is None:
            raise
        print(missing.line(f"soakmatrix {name}"), file=sys.stderr)
        return EXIT_USAGE
    parser = argparse.ArgumentParser(prog=f"soakmatrix {name}", description=module.HELP)
    module.configure(parser)
    if getattr(module, "ACCEPTS_UNKNOWN_ARGS", False):
        # e.g. sim-engine takes any `vllm serve` flag and notes the ones it ignores
        args, unknown = parser.parse_known_args(rest)
        args.unknown_args = unknown
    else:
        args = parser.parse_args(rest)
    # a long command (a nightly, a bisection, a watch) carries on when its stderr's reader goes
    # away: its results are in files, the progress lines only for whoever watches
    saved_stderr = sys.stderr
    if getattr(module, "OUTLIVES_ITS_READER", False) and not isinstance(sys.stderr, LastingStream):
        # closed at start: nobody to read it, straight to the file
        sys.stderr = gone_from_the_start(LastingStream(sys.stderr), "stderr")
    try:
        return _call(name, module, args)
    finally:
        sys.stderr = saved_stderr


def _call(name: str, module, args: argparse.Namespace) -> int:
    try:
        extras.require(*NEEDS.get(name, ()))  # after parsing: `--help` needs no extra
        code = int(module.main(args) or 0)
        sys.stdout.flush()  # a reader gone away shows here, inside the handlers, not at exit
        return code
    except SpecError as exc:
        print(f"soakmatrix {name}: configuration error:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    except extras.MissingExtra as exc:
        print(exc.line(f"soakmatrix {name}"), file=sys.stderr)
        return EXIT_USAGE
    except Stopped as exc:
        print(f"soakmatrix {name}: stopped by {signal_name(exc.signum)}", file=sys.stderr)
        return EXIT_FOR[exc.signum]
    except KeyboardInterrupt:
        print(f"soakmatrix {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `soakmatrix report STORE | head`: the reader has what it wanted; no traceback, and no
        # second error when the interpreter flushes stdout on the way out
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # noqa: BLE001 - a bug of ours is no verdict, never exit 1 ("hang found")
        missing = extras.from_import_error(exc, among=NEEDS.get(name, ())) if isinstance(exc, ImportError) else None
        if missing is not None:  # an optional import no check guarded: still a line, not a traceback
            print(missing.line(f"soakmatrix {name}"), file=sys.stderr)
            return EXIT_USAGE
        traceback.print_exc()
        print(f"soakmatrix {name}: internal error (above); no verdict", file=sys.stderr)
        return EXIT_INFRA


if __name__ == "__main__":
    sys.exit(main())
