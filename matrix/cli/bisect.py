"""`soakmatrix bisect`: the smallest set of flags that still hangs like a failing cell, with confidence.

Reads the options and calls the API's `soakmatrix.bisect_flags` (or `soakmatrix.bisect_builds` with
--builds), which set the bisection up from the matrix, run it, write the pytest regression test
(--emit-test) and record the answer (--store); this module prints the table or JSON. Exit codes (EPILOG, in --help): 1 a minimal set was found (a hang), 0 the
failing cell did not reproduce, 3 inconclusive (budget or probes exhausted, no verdict), 2 usage or
configuration error. The result is printed before anything that can fail after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from soakmatrix.api.builds import bisect_builds
from soakmatrix.api.errors import UsageError
from soakmatrix.api.flags import bisect_flags
from soakmatrix.api.types import DEFAULT_BISECT_OUT, BisectOptions, FlagBisection
from soakmatrix.matrix.arguments import (
    half_open_unit_interval,
    integer,
    open_unit_interval,
    positive_duration,
    positive_number,
    seed,
    text,
    typed,
)
from soakmatrix.matrix.bisect import Settings
from soakmatrix.matrix.bisect.journal import JournalError
from soakmatrix.matrix.build_bisect.specs import parse_range
from soakmatrix.matrix.contracts.outcomes import EXIT_INFRA, EXIT_USAGE
from soakmatrix.matrix.contracts.redact import redact_text
from soakmatrix.matrix.lasting_stream import divert_stderr
from soakmatrix.matrix.paths import CONFIG_FILE, input_dir, output_dir, output_file
from soakmatrix.matrix.schedule.cluster_loss import ClusterLost
from soakmatrix.matrix.stop_signals import Stopped, StopSignals

DEFAULT_OUT = DEFAULT_BISECT_OUT
MAX_PARALLEL = 64  # probes at once: more than a cluster's GPUs hold, and each holds a server's memory
MAX_PROBES = 100_000
EXIT_INCONCLUSIVE = EXIT_INFRA  # the same number as run's infrastructure error; for bisect it means inconclusive

HELP = (
    "Find the smallest set of flags (relative to the matrix baseline) that still hangs with the failing "
    "cell's signature, with stated confidence, spending few GPU-hours."
)
OUTLIVES_ITS_READER = True  # hours of work whose results are in files: a closed stderr does not end it

EPILOG = """exit codes:
  0  not reproduced: the failing cell did not hang with the target signature (the report bounds its MTTF)
  1  found: a minimal set of flags that hangs (a hang, like `run`'s 1)
  2  usage or configuration error (named option or file:line: key: message), or no Ray cluster to
     reach at --ray-address; nothing was run
  3  inconclusive: the probe or GPU-hour budget ran out before a verdict (for bisect, 3 is never an
     infrastructure error: its probes retry those; --resume with a larger --max-probes or
     --budget-gpu-hours continues); or the Ray cluster was lost mid-bisection (one line says so;
     the answered probes are kept, --resume continues once the cluster is back)
  130 / 143  stopped by SIGINT / SIGTERM: the probes' servers torn down, the answered probes kept

Every answered probe is kept in a journal in --out (real probes: bisect-out by default; --virtual:
only with --out); --resume replays it and soaks on from there.

A failure after the bisection (writing --emit-test, recording into --store) keeps the printed result
and its exit code and says what failed on stderr."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("matrix", type=CONFIG_FILE, help="matrix YAML file")
    parser.add_argument(
        "--cell", required=True, type=text, help="the failing cell: its id or its name (see `soakmatrix plan`)"
    )
    parser.add_argument("--profile", type=text, help="profile (default: the first); gives start-up time and retries")
    parser.add_argument(
        "--signature",
        type=text,
        help="the hang to bisect (e.g. shm_broadcast_timeout); other signatures only "
        "end probes. Default: the cell's newest hang in --store, else the hang "
        "model's (--virtual), else the calibration's first hang (never a crash)",
    )
    parser.add_argument(
        "--confidence",
        type=open_unit_interval,
        default=0.95,
        help="stated confidence (above 0 and below 1; default 0.95)",
    )
    parser.add_argument(
        "--mttf-cap",
        type=positive_duration,
        help="ask for the smallest set that hangs with MTTF at most this (e.g. 6h): a flag "
        "without which the hang is slower joins the set (its verdict says so). Default: no "
        "cap; a flag is necessary only when no hang was seen without it, its absence soaked "
        "until an 8x slowdown is ruled out. From 1s to 365d",
    )
    parser.add_argument("--virtual", action="store_true", help="virtual time: draw hangs from the hang model")
    parser.add_argument("--hang-model", type=CONFIG_FILE, help="hang-model file (default: the matrix's sim.hang_model)")
    parser.add_argument(
        "--seed",
        type=seed,
        help="virtual oracle seed (default: the hang model's); on the simulated engine "
        "(flags or --builds), the base of its probes' engine seeds (0 to 2^63-1)",
    )
    parser.add_argument(
        "--calibration-hangs",
        type=integer(1, 100),
        default=2,
        help="hangs of the failing cell first (1 to 100; default 2)",
    )
    parser.add_argument(
        "--parallel",
        type=integer(1, MAX_PARALLEL),
        default=None,
        help=f"probes per batch (1 to {MAX_PARALLEL}; default 1 virtual, 2 on Ray; with --builds 1; "
        "more finish sooner but spend more GPU-hours)",
    )
    parser.add_argument(
        "--budget-gpu-hours",
        type=positive_number,
        help="stop (inconclusive) after this many GPU-hours (above 0 and at most 1,000,000)",
    )
    parser.add_argument(
        "--max-probes",
        type=integer(1, MAX_PROBES),
        default=200,
        help=f"stop (inconclusive) after this many probes (1 to {MAX_PROBES:,}; default 200)",
    )
    parser.add_argument(
        "--modifier-prior",
        type=half_open_unit_interval,
        default=Settings.modifier_prior,
        help="with --mttf-cap: prior probability that one flag outside the set slows the hang x6 or "
        "more; the rate check after the search settles whether it is needed to hang within the "
        f"cap (at least 0 and below 1; default {Settings.modifier_prior}; 0 skips the check). Without a cap a flag "
        "without which the hang was seen is a modifier, never part of the set",
    )
    parser.add_argument("--no-shrink", action="store_true", help="do not try other values of the set's flags")
    parser.add_argument(
        "--no-modifiers",
        action="store_true",
        help="do not soak the flags outside the set for modifier verdicts (they are reported "
        "`unmeasured`); saves the measuring soaks when only the set matters",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument(
        "--emit-test", metavar="PATH", type=output_file, help="write a pytest regression test for the minimal set"
    )
    parser.add_argument(
        "--junit",
        metavar="FILE",
        type=output_file,
        help="with --builds: the answer's JUnit XML, a test case per signature",
    )
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument(
        "--ray-address", type=text, help="Ray cluster address (default: RAY_ADDRESS or a local cluster)"
    )
    parser.add_argument(
        "--out",
        type=output_dir,
        help=f"soak job artifacts and the probe journal (default: {DEFAULT_OUT}; with "
        "--virtual, a journal only when given)",
    )
    parser.add_argument(
        "--max-soak",
        type=positive_duration,
        metavar="DURATION",
        help="soak a longer probe in pieces of at most this much load, each one start-up more, so a "
        "crash or a lost node costs one piece (1s to 365d; default: 12h with real probes; none "
        "with --virtual)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the bisection whose probe journal is in --out (after a crash, Ctrl-C or a "
        "budget that ran out): its answered probes are replayed, not soaked again; the cell and "
        "options must be the same (--budget-gpu-hours and --max-probes may grow)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--builds",
        metavar="FILE|GOOD..BAD",
        type=builds_source,
        help="bisect engine builds instead of flags: an ordered builds file (`NAME: SPEC` lines, "
        "oldest first) or the commits GOOD..BAD of --checkout turned into specs by "
        "--build-template (GOOD..BAD naming two builds of the matrix's `builds:`: the section "
        "between them); a line may name a build of `builds:`. Each probe soaks "
        "the cell on one build through Ray's runtime_env (--virtual: the hang model instead); "
        "with --store, the cell's results on listed builds count as evidence",
    )
    parser.add_argument(
        "--then-flags",
        action="store_true",
        help="with --builds: once the first bad build is found, bisect the cell's flags on that build "
        "(both reports are printed; --json nests the flags' under `flags`; the exit code is then "
        "the flag bisection's)",
    )
    parser.add_argument(
        "--build-template",
        metavar="SPEC",
        type=text,
        help="a pip spec with {sha}, e.g. 'vllm @ git+https://github.com/vllm-project/vllm@{sha}' (with GOOD..BAD)",
    )
    parser.add_argument(
        "--checkout", default=".", type=input_dir, help="the git checkout GOOD..BAD is read from (default: .)"
    )
    parser.add_argument(
        "--store",
        metavar="FILE",
        type=output_file,
        help="history store (SQLite; a new file is created) to take the cell's signature from and "
        "record the result in; `soakmatrix report` shows it. The cell's recorded hangs of the "
        "target and their load count as free exposure of the failing cell (the report says how "
        "much and what it spared). Checked before the bisection runs",
    )


def builds_source(value: str) -> str:
    """`--builds`: GOOD..BAD when it reads as one and no such file exists, else a builds file."""
    if parse_range(value) is not None and not os.path.lexists(value):
        return text(value)
    return CONFIG_FILE(value)


typed(builds_source, "path-in")


def main(args: argparse.Namespace) -> int:
    stop = StopSignals()
    try:
        with stop:
            return _main(args)
    except (UsageError, JournalError) as exc:
        print(f"soakmatrix bisect: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterLost as exc:  # the probes under way died with the cluster; the answered ones are journaled
        out = journal_dir(args)
        print(
            f"soakmatrix bisect: {exc}; the answered probes are kept in {out}; once the cluster is back, "
            "`--resume` continues",
            file=sys.stderr,
        )
        return EXIT_INFRA
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the probes were stopped and their servers torn down; what was answered is
        # in the journal. The signal decides the exit code (130 / 143), however deep it was caught.
        out = journal_dir(args)
        if out is not None and any((out / f"journal-{kind}.jsonl").exists() for kind in ("flags", "builds")):
            print(f"soakmatrix bisect: the answered probes are kept in {out}; `--resume` continues", file=sys.stderr)
        if stop.received:
            raise Stopped(stop.received) from None
        raise


def journal_dir(args: argparse.Namespace) -> Path | None:
    """Where the probe journal goes: --out; real probes default to bisect-out, virtual ones keep none."""
    return BisectOptions(out=args.out, virtual=args.virtual).journal_dir


def _say(line: str) -> None:
    print(f"soakmatrix bisect: {line}", file=sys.stderr)


def _main(args: argparse.Namespace) -> int:
    options = BisectOptions.from_args(args)
    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if options.journal_dir is not None:
        divert_stderr(options.journal_dir / "progress.log")  # where progress goes if stderr's reader goes away
    if args.junit and not args.builds:
        raise UsageError("--junit is the build bisection's (--builds): a flag bisection writes no JUnit")
    if args.builds:
        built = bisect_builds(
            args.matrix,
            args.cell,
            args.builds,
            profile=args.profile,
            then_flags=args.then_flags,
            options=options,
            progress=progress,
            warn=_say,
            report=sys.stdout,
            as_json=args.json,
        )
        for line in built.flags.warnings if built.flags else ():
            _say(line)
        return built.exit_code
    answer = bisect_flags(
        args.matrix,
        args.cell,
        profile=args.profile,
        options=options,
        progress=progress,
        warn=_say,
        on_result=lambda answer: _print(answer, args.json),
    )
    for line in answer.warnings:
        _say(line)
    return answer.exit_code


def _print(answer: FlagBisection, as_json: bool) -> None:
    """The result first: what can fail after it (a test file, the store) must not lose hours of probes."""
    if as_json:
        json.dump(answer.doc, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(answer.text)
    sys.stdout.flush()
