"""`soakmatrix bisect`: the smallest set of flags that still hangs like a failing cell, with confidence.

Reads the options, sets the bisection up from the matrix (`matrix.bisect.setup`: the cell, its
elements and context, the oracle: virtual time from a hang model, or soak jobs on Ray), runs
`matrix.bisect.bisect`, prints the table or JSON and optionally writes a pytest regression test
(`matrix.bisect.emit`). Exit codes (EPILOG, in --help): 1 a minimal set was found (a hang), 0 the
failing cell did not reproduce, 3 inconclusive (budget or probes exhausted, no verdict), 2 usage or
configuration error. The result is printed before anything that can fail after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

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
from soakmatrix.matrix.bisect import MAX_ELEMENTS, Settings, bisect
from soakmatrix.matrix.bisect.emit import write_regression_test
from soakmatrix.matrix.bisect.history_exposure import HistoryExposure, calibration_saved, failing_hangs_wanted
from soakmatrix.matrix.bisect.history_exposure import to_json as history_json
from soakmatrix.matrix.bisect.journal import JournalError, ProbeJournal, journaled
from soakmatrix.matrix.bisect.oracle_chunked import DEFAULT_MAX_SOAK_S
from soakmatrix.matrix.bisect.oracle_lazy import SoakOnFirstProbe
from soakmatrix.matrix.bisect.report import render_text, to_json
from soakmatrix.matrix.bisect.setup import (
    alternatives_of,
    elements_of,
    feasibility,
    find_cell,
    model_signature,
    recorded_exposure,
    recorded_signature,
    soak_oracle,
    virtual_oracle,
)
from soakmatrix.matrix.build_bisect.cli_run import RAY_HINT, BuildUsage, RealProbes, run_for_cell
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.build_bisect.specs import parse_range
from soakmatrix.matrix.contracts.redact import redact_text
from soakmatrix.matrix.lasting_stream import divert_stderr
from soakmatrix.matrix.paths import CONFIG_FILE, empty_store_warning, input_dir, output_dir, output_file
from soakmatrix.matrix.plan import PlannedCell, plan, planned_cell
from soakmatrix.matrix.schedule.cluster import CONNECT_ERRORS, address_from, cannot_reach
from soakmatrix.matrix.schedule.cluster_loss import ClusterLost
from soakmatrix.matrix.spec import Matrix, Profile, load_matrix
from soakmatrix.matrix.spec_types import Build
from soakmatrix.matrix.stop_signals import Stopped, StopSignals

DEFAULT_OUT = "bisect-out"
MAX_PARALLEL = 64          # probes at once: more than a cluster's GPUs hold, and each holds a server's memory
MAX_PROBES = 100_000
EXIT_INCONCLUSIVE = EXIT_INFRA   # the same number as run's infrastructure error; for bisect it means inconclusive

HELP = ("Find the smallest set of flags (relative to the matrix baseline) that still hangs with the failing "
        "cell's signature, with stated confidence, spending few GPU-hours.")
OUTLIVES_ITS_READER = True   # hours of work whose results are in files: a closed stderr does not end it

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
    parser.add_argument("--cell", required=True, type=text, help="the failing cell: its id or its name (see `soakmatrix plan`)")
    parser.add_argument("--profile", type=text, help="profile (default: the first); gives start-up time and retries")
    parser.add_argument("--signature", type=text, help="the hang to bisect (e.g. shm_broadcast_timeout); other signatures only "
                                            "end probes. Default: the cell's newest hang in --store, else the hang "
                                            "model's (--virtual), else the calibration's first hang (never a crash)")
    parser.add_argument("--confidence", type=open_unit_interval, default=0.95,
                        help="stated confidence (above 0 and below 1; default 0.95)")
    parser.add_argument("--mttf-cap", type=positive_duration,
                        help="ask for the smallest set that hangs with MTTF at most this (e.g. 6h): a flag "
                             "without which the hang is slower joins the set (its verdict says so). Default: no "
                             "cap; a flag is necessary only when no hang was seen without it, its absence soaked "
                             "until an 8x slowdown is ruled out. From 1s to 365d")
    parser.add_argument("--virtual", action="store_true", help="virtual time: draw hangs from the hang model")
    parser.add_argument("--hang-model", type=CONFIG_FILE, help="hang-model file (default: the matrix's sim.hang_model)")
    parser.add_argument("--seed", type=seed, help="virtual oracle seed (default: the hang model's); on the simulated engine "
                                                "(flags or --builds), the base of its probes' engine seeds (0 to 2^63-1)")
    parser.add_argument("--calibration-hangs", type=integer(1, 100), default=2,
                        help="hangs of the failing cell first (1 to 100; default 2)")
    parser.add_argument("--parallel", type=integer(1, MAX_PARALLEL), default=None,
                        help=f"probes per batch (1 to {MAX_PARALLEL}; default 1 virtual, 2 on Ray; with --builds 1; "
                             "more finish sooner but spend more GPU-hours)")
    parser.add_argument("--budget-gpu-hours", type=positive_number,
                        help="stop (inconclusive) after this many GPU-hours (above 0 and at most 1,000,000)")
    parser.add_argument("--max-probes", type=integer(1, MAX_PROBES), default=200,
                        help=f"stop (inconclusive) after this many probes (1 to {MAX_PROBES:,}; default 200)")
    parser.add_argument("--modifier-prior", type=half_open_unit_interval, default=Settings.modifier_prior,
                        help="with --mttf-cap: prior probability that one flag outside the set slows the hang x6 or "
                             "more; the rate check after the search settles whether it is needed to hang within the "
                             f"cap (at least 0 and below 1; default {Settings.modifier_prior}; 0 skips the check). Without a cap a flag "
                             "without which the hang was seen is a modifier, never part of the set")
    parser.add_argument("--no-shrink", action="store_true", help="do not try other values of the set's flags")
    parser.add_argument("--no-modifiers", action="store_true",
                        help="do not soak the flags outside the set for modifier verdicts (they are reported "
                             "`unmeasured`); saves the measuring soaks when only the set matters")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--emit-test", metavar="PATH", type=output_file, help="write a pytest regression test for the minimal set")
    parser.add_argument("--junit", metavar="FILE", type=output_file, help="with --builds: the answer's JUnit XML, a test case per signature")
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--ray-address", type=text, help="Ray cluster address (default: RAY_ADDRESS or a local cluster)")
    parser.add_argument("--out", type=output_dir, help=f"soak job artifacts and the probe journal (default: {DEFAULT_OUT}; with "
                        "--virtual, a journal only when given)")
    parser.add_argument("--max-soak", type=positive_duration, metavar="DURATION",
                        help="soak a longer probe in pieces of at most this much load, each one start-up more, so a "
                             "crash or a lost node costs one piece (1s to 365d; default: 12h with real probes; none "
                             "with --virtual)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the bisection whose probe journal is in --out (after a crash, Ctrl-C or a "
                             "budget that ran out): its answered probes are replayed, not soaked again; the cell and "
                             "options must be the same (--budget-gpu-hours and --max-probes may grow)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--builds", metavar="FILE|GOOD..BAD", type=builds_source,
                        help="bisect engine builds instead of flags: an ordered builds file (`NAME: SPEC` lines, "
                             "oldest first) or the commits GOOD..BAD of --checkout turned into specs by "
                             "--build-template (GOOD..BAD naming two builds of the matrix's `builds:`: the section "
                             "between them); a line may name a build of `builds:`. Each probe soaks "
                             "the cell on one build through Ray's runtime_env (--virtual: the hang model instead); "
                             "with --store, the cell's results on listed builds count as evidence")
    parser.add_argument("--then-flags", action="store_true",
                        help="with --builds: once the first bad build is found, bisect the cell's flags on that build "
                             "(both reports are printed; --json nests the flags' under `flags`; the exit code is then "
                             "the flag bisection's)")
    parser.add_argument("--build-template", metavar="SPEC", type=text, help="a pip spec with {sha}, e.g. "
                        "'vllm @ git+https://github.com/vllm-project/vllm@{sha}' (with GOOD..BAD)")
    parser.add_argument("--checkout", default=".", type=input_dir, help="the git checkout GOOD..BAD is read from (default: .)")
    parser.add_argument("--store", metavar="FILE", type=output_file,
                        help="history store (SQLite; a new file is created) to take the cell's signature from and "
                             "record the result in; `soakmatrix report` shows it. The cell's recorded hangs of the "
                             "target and their load count as free exposure of the failing cell (the report says how "
                             "much and what it spared). Checked before the bisection runs")


def builds_source(value: str) -> str:
    """`--builds`: GOOD..BAD when it reads as one and no such file exists, else a builds file."""
    if parse_range(value) is not None and not os.path.lexists(value):
        return text(value)
    return CONFIG_FILE(value)


typed(builds_source, "path-in")


def _open_store(path: str):
    """The history store, opened (and so checked) before hours of probes: a file that is not one is exit 2."""
    from soakmatrix.reports.history import HistoryStore, StoreError

    try:
        return HistoryStore(path)
    except (StoreError, OSError, sqlite3.Error) as exc:
        raise _Usage(f"--store: {exc}") from None


class _Usage(Exception):
    pass


def main(args: argparse.Namespace) -> int:
    stop = StopSignals()
    try:
        with stop:
            return _main(args)
    except (_Usage, JournalError) as exc:
        print(f"soakmatrix bisect: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterLost as exc:   # the probes under way died with the cluster; the answered ones are journaled
        out = journal_dir(args)
        print(f"soakmatrix bisect: {exc}; the answered probes are kept in {out}; once the cluster is back, "
              "`--resume` continues", file=sys.stderr)
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
    if args.out:
        return Path(args.out)
    return None if args.virtual else Path(DEFAULT_OUT)


def max_soak_s(args: argparse.Namespace) -> float | None:
    """The longest piece of load one probe soaks in (`--max-soak`): 12 h with real probes, none in
    virtual time (whose GPU-hours are then the benchmark's)."""
    if args.max_soak is not None:
        return args.max_soak
    return None if args.virtual else DEFAULT_MAX_SOAK_S


def _journal(args: argparse.Namespace, kind: str, header: dict,
             progress: Callable[[str], None] | None) -> ProbeJournal | None:
    folder = journal_dir(args)
    if folder is None:
        if args.resume:
            raise _Usage("--resume: with --virtual, give the --out the journal was written to")
        return None
    try:
        journal = ProbeJournal(folder / f"journal-{kind}.jsonl", {"kind": kind, **header}, resume=args.resume)
    except OSError as exc:
        raise _Usage(f"--out: cannot write the probe journal: {exc}") from None
    if progress and args.resume:
        progress(f"soakmatrix bisect: resuming from {journal.path}: {journal.probes} answered probe(s) replayed"
                 if journal.batches else f"soakmatrix bisect: --resume: no answered probe in {journal.path}; "
                 "starting afresh")
    return journal


def _main(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    result_plan = plan(matrix, args.profile)
    try:
        pc = find_cell(result_plan.cells, args.cell, matrix)
    except LookupError as exc:
        raise _Usage(str(exc)) from None
    profile = result_plan.profile

    hang_model_path = args.hang_model or matrix.sim.hang_model
    if args.virtual and not hang_model_path:
        raise _Usage("--virtual needs a hang model: --hang-model FILE or the matrix's sim.hang_model")
    signature, source = (args.signature, "--signature") if args.signature else (None, "")
    history = None
    if args.store:
        warning = empty_store_warning("--store", args.store)
        if warning:
            print(f"soakmatrix bisect: {warning}", file=sys.stderr)
        store = _open_store(args.store)
        with store:
            if signature is None:
                signature, source = recorded_signature(store, pc.id)
            if signature is None and args.virtual:
                signature, source = model_signature(matrix, pc, hang_model_path)
            # the nightly's results of this very cell: free exposure for the calibration
            history = recorded_exposure(store, pc.id, signature)
    if signature is None and args.virtual:
        signature, source = model_signature(matrix, pc, hang_model_path)

    if args.signature:
        _check_signature(args.signature, args.virtual, hang_model_path, matrix)
    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if journal_dir(args) is not None:
        divert_stderr(journal_dir(args) / "progress.log")   # where progress goes if stderr's reader goes away
    if args.junit and not args.builds:
        raise _Usage("--junit is the build bisection's (--builds): a flag bisection writes no JUnit")
    if args.builds:
        return _builds(args, matrix, profile, pc, signature, hang_model_path, progress)
    run = _flag_bisection(args, matrix, profile, pc, signature, source, history, hang_model_path, progress)
    # the result first: what can fail after it (a test file, the store) must not lose hours of probes
    sys.stdout.write(json.dumps(run.doc, indent=2, sort_keys=True, default=str) + "\n" if args.json else run.text)
    sys.stdout.flush()
    _after(args, run, matrix, hang_model_path, progress)
    return run.code


def _check_signature(signature: str, virtual: bool, hang_model_path: str | None, matrix: Matrix) -> None:
    """A --signature the virtual oracle can never answer is refused (the bisection would only run out of
    probes); one no detector knows is a warning (a real engine may still show it)."""
    from soakmatrix.jobs.signatures import SIGNATURES
    from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_hang_model

    if virtual and hang_model_path:
        model = load_hang_model(hang_model_path, registry=matrix.registry)
        planted = sorted({STYLE_SIGNATURE[h.style] for h in model.hangs})
        if signature not in planted:
            raise _Usage(f"--signature {signature!r}: the hang model {hang_model_path} plants no hang with it "
                         f"(it has: {', '.join(planted) or 'none'})")
    elif signature not in SIGNATURES and signature not in STYLE_SIGNATURE.values():
        print(f"soakmatrix bisect: warning: --signature {signature!r} is no signature the detectors name "
              f"(they know: {', '.join(sorted(SIGNATURES))}); probes will end only on it", file=sys.stderr)


@dataclass(frozen=True)
class FlagRun:
    """A finished flag bisection of one cell: its exit code, its result, `--json`'s document and the text."""
    pc: PlannedCell
    result: Any
    code: int
    doc: dict
    text: str


def _flag_bisection(args: argparse.Namespace, matrix: Matrix, profile: Profile, pc: PlannedCell,
                    signature: str | None, source: str, history: Any, hang_model_path: str | None,
                    progress: Callable[[str], None] | None) -> FlagRun:
    # only the flag bisection moves flags: a build bisection keeps the cell's flags as they are
    movable, fixed, why = elements_of(pc, matrix)
    if len(movable) > MAX_ELEMENTS:
        raise _Usage(f"{len(movable)} flags differ from the baseline; at most {MAX_ELEMENTS}")
    settings = Settings(confidence=args.confidence, mttf_cap_s=args.mttf_cap, startup_s=profile.startup_s,
                        calibration_hangs=args.calibration_hangs, parallel=args.parallel or (1 if args.virtual else 2),
                        max_probes=args.max_probes, budget_gpu_hours=args.budget_gpu_hours,
                        shrink_values=not args.no_shrink, modifier_prior=args.modifier_prior,
                        measure_modifiers=not args.no_modifiers)
    # the journal before Ray: one that cannot be used is exit 2 before a cluster starts
    steering = {k: v for k, v in asdict(settings).items() if k not in ("max_probes", "budget_gpu_hours")}
    journal = _journal(args, "flags", {
        "cell": pc.id, "build": pc.build.name if pc.build else None, "signature": signature,
        "virtual": args.virtual, "backend": args.backend, "seed": args.seed, **steering,
        "max_soak_s": max_soak_s(args),
        "history": [history.signature, history.hangs, history.exposure_s] if history else None}, progress)
    if args.virtual:
        oracle: Any = virtual_oracle(matrix, pc, profile, hang_model_path, args.seed)
    else:
        def start() -> tuple[Any, Any]:
            try:
                started = soak_oracle(matrix, pc, profile, backend=args.backend, ray_address=args.ray_address,
                                      out_dir=str(journal_dir(args)), seed=args.seed)
            except CONNECT_ERRORS as exc:
                raise _Usage(f"{cannot_reach(address_from(args.ray_address), exc)} {RAY_HINT}") from None
            if progress:
                progress(f"soakmatrix bisect: on {redact_text(started[1].description)}")
            return started

        oracle = SoakOnFirstProbe(start)
        if journal is None or not journal.batches:
            try:
                oracle.started()
            except BaseException:
                if journal is not None:
                    journal.close()
                raise
    cluster = oracle if isinstance(oracle, SoakOnFirstProbe) else None
    oracle = journaled(oracle, journal, max_soak_s(args))
    if progress:
        progress(f"soakmatrix bisect: cell {pc.id} {pc.name}: {len(movable)} flag(s) differ from the baseline "
                 f"({', '.join(e.name for e in movable) or 'none'})"
                 + (f"; context: {', '.join(why)}" if why else "")
                 + (f"; target signature {signature} (from {source})" if signature else ""))
    try:
        result = bisect(pc.cell.flag_dict, movable, oracle, settings, signature=signature, context=why,
                        context_elements=fixed, alternatives=alternatives_of(movable, matrix),
                        feasible=feasibility(pc, matrix), progress=progress, signature_source=source,
                        history=history)
    finally:
        if cluster is not None:
            cluster.close()
        if journal is not None:
            journal.close()
    doc = to_json(result)
    doc.update({"matrix": matrix.file, "cell": {"id": pc.id, "name": pc.name},
                "oracle": "virtual" if args.virtual else f"soak ({args.backend})"})
    if history is not None:
        doc["history"] = history_json(history, calibration_saved(history, failing_hangs_wanted(settings),
                                                                 pc.gpu_count, settings.startup_s))
    code = {"found": EXIT_FOUND, "not_reproduced": EXIT_OK}.get(result.status, EXIT_INCONCLUSIVE)
    return FlagRun(pc, result, code, doc, f"cell {pc.id}  {pc.name}\n" + render_text(result))


def _builds(args: argparse.Namespace, matrix: Matrix, profile: Profile, pc: PlannedCell, signature: str | None,
            hang_model_path: str | None, progress: Callable[[str], None] | None) -> int:
    """The build bisection; with --then-flags, the flag bisection of the cell on its first bad build."""
    flag_runs: list[FlagRun] = []

    def then(build: Build, target: str | None, seen: Any) -> tuple[int, dict, str]:
        # the failing cell's flags, model, GPU and workload on the first bad build; what the build
        # bisection saw there (the store's results on that build included) is its free exposure
        combo = {"model": pc.cell.model, "gpu": pc.cell.gpu, "workload": pc.cell.workload, **pc.cell.flag_dict}
        bad = planned_cell(matrix, profile, combo, build=build)
        history = None
        if target is not None and seen.exposure_s > 0:
            history = HistoryExposure(target, seen.hangs, seen.exposure_s, seen.probes - seen.untestable,
                                      (), source=f"the build bisection on {build.name}")
        if progress:
            progress(f"soakmatrix bisect: the flags of the cell on the first bad build {build.name}")
        run = _flag_bisection(args, matrix, profile, bad, target, "the build bisection" if target else "", history,
                              hang_model_path, progress)
        flag_runs.append(run)
        return run.code, run.doc, run.text

    try:
        code = run_for_cell(matrix, pc, profile, builds_arg=args.builds, template=args.build_template,
                            checkout=args.checkout, virtual=args.virtual, hang_model_path=hang_model_path,
                            seed=args.seed, confidence=args.confidence, budget_gpu_hours=args.budget_gpu_hours,
                            max_probes=args.max_probes, calibration_hangs=args.calibration_hangs,
                            signature=signature, as_json=args.json, out=sys.stdout, progress=progress,
                            real=RealProbes(args.backend, args.ray_address, str(journal_dir(args) or DEFAULT_OUT)),
                            store_path=args.store, then=then if args.then_flags else None,
                            parallel=args.parallel or 1, max_soak_s=max_soak_s(args), junit=args.junit,
                            journal=lambda header: _journal(args, "builds", header, progress))
    except BuildUsage as exc:
        raise _Usage(str(exc)) from None
    for run in flag_runs:
        _after(args, run, matrix, hang_model_path, progress)
    return code


def _after(args: argparse.Namespace, run: FlagRun, matrix: Matrix, hang_model_path: str | None,
           progress: Callable[[str], None] | None) -> None:
    """What comes after a printed flag bisection: the regression test (--emit-test), the store (--store)."""
    if args.emit_test:
        if run.result.status != "found":
            print("soakmatrix bisect: no minimal set, so no regression test written", file=sys.stderr)
        else:
            try:
                path = write_regression_test(args.emit_test, run.result, run.pc, matrix, args.backend,
                                             hang_model_path)
            except OSError as exc:
                print(f"soakmatrix bisect: --emit-test: could not write {args.emit_test}: {exc}; the result above "
                      "stands", file=sys.stderr)
            else:
                if progress:
                    progress(f"soakmatrix bisect: wrote {path}")
    if args.store:
        from soakmatrix.reports.history import HistoryStore, StoreError

        try:
            with HistoryStore(args.store) as store:
                store.record_bisection(run.pc.id, run.doc)
        except (StoreError, OSError, sqlite3.Error) as exc:
            print(f"soakmatrix bisect: --store: could not record the result in {args.store}: {exc}; the result "
                  "above stands", file=sys.stderr)
