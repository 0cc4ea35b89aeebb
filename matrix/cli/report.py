"""`soakmatrix report`: text tables, the dashboard and JUnit from a history store; or merge JUnit files.

soakmatrix report STORE                       # runs, cells that need a look, signatures, bisections
soakmatrix report STORE --out DIR             # + the dashboard, DIR/index.html
soakmatrix report STORE --junit FILE [--run RUN_ID]   # + JUnit of one run (default: the latest)
soakmatrix report STORE --known-issues FILE   # findings matched to upstream issues (also in JUnit and the dashboard)
soakmatrix report STORE --refingerprint       # re-hash old nights' fingerprints with today's code first
soakmatrix report --merge A.xml B.xml ... -o OUT.xml  # merge shards' JUnit files
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from soakmatrix.matrix.arguments import integer, text
from soakmatrix.matrix.contracts.outcomes import EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.contracts.redact import redact_text
from soakmatrix.matrix.paths import CONFIG_FILE, existing_store, input_file, output_dir, output_file

EXIT_UNWRITTEN = EXIT_INFRA  # an output could not be written: the file system failed us, no verdict
MAX_JUNIT_BYTES = 64 << 20  # a JUnit file to merge: twice GitLab's 30 MB limit; more is no CI report

EPILOG = """exit codes:
  0  the report was printed and every output asked for (--out, --junit, -o) was written whole
  2  usage error: a store, file or option that cannot be used, named with its path; nothing was written
  3  an output could not be written (a full disk, an I/O error): it names the file; an output is
     written to a temporary file and renamed, so the previous version of the file stays intact"""

HELP = (
    "Print what a history store knows (runs, failing and flaky cells, hang signatures, bisections), "
    "write the dashboard (--out) and a run's JUnit (--junit), or merge JUnit files (--merge)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "store", nargs="?", type=existing_store, help="history store (SQLite) written by `soakmatrix run`"
    )
    parser.add_argument("--out", metavar="DIR", type=output_dir, help="write the dashboard to DIR/index.html")
    parser.add_argument(
        "--run",
        metavar="RUN_ID",
        type=text,
        help="run for --junit and the findings list (default: the latest with results)",
    )
    parser.add_argument("--junit", metavar="FILE", type=output_file, help="write the run's JUnit XML here")
    parser.add_argument(
        "--merge", nargs="+", metavar="XML", type=input_file(MAX_JUNIT_BYTES), help="JUnit files to merge (needs -o)"
    )
    parser.add_argument("-o", "--output", metavar="OUT.xml", type=output_file, help="where --merge writes")
    parser.add_argument(
        "--known-issues",
        metavar="YAML",
        type=CONFIG_FILE,
        help="known issues file (fingerprint or frame/log pattern -> upstream issue), matched "
        "automatically; see matrix/examples/known_issues.yaml",
    )
    parser.add_argument(
        "--refingerprint",
        action="store_true",
        help="first re-hash every recorded hang's and crash's fingerprint from the evidence in its "
        "cell folder with this version's code (after an upgrade that changed fingerprints, "
        "old nights' findings join the new ones); results whose evidence is gone keep theirs",
    )
    parser.add_argument(
        "--limit", type=integer(1, 100_000), default=50, help="rows of the cells table (1 to 100,000; default 50)"
    )


def main(args: argparse.Namespace) -> int:
    try:
        if args.merge:
            return _merge(args)
        if not args.store:
            raise UsageError("give a history store (STORE), or --merge A.xml B.xml ... -o OUT.xml")
        if args.output:
            raise UsageError("-o/--output goes with --merge; the dashboard folder is --out DIR")
        return _report(args)
    except UsageError as exc:
        print(f"soakmatrix report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unwritten as exc:
        print(f"soakmatrix report: {exc}", file=sys.stderr)
        return EXIT_UNWRITTEN


class UsageError(Exception):
    pass


class Unwritten(Exception):
    """An output the user asked for could not be written."""


def _writing(option: str, path, write):
    """`write()`, its OSError turned into an error that names the option and the file."""
    try:
        return write()
    except OSError as exc:
        raise Unwritten(f"{option}: could not write {exc.filename or path}: {exc.strerror or exc}") from None


def _merge(args: argparse.Namespace) -> int:
    from soakmatrix.reports.junit import JUnitMergeError, merge_junit

    if not args.output:
        raise UsageError("--merge needs -o OUT.xml")
    if args.store:
        raise UsageError(f"--merge takes JUnit files only; did you mean to list {args.store!r} after --merge?")
    try:
        out = _writing("-o", args.output, lambda: merge_junit(args.merge, args.output))
    except JUnitMergeError as exc:
        raise UsageError(str(exc)) from None
    from junitparser import xunit2

    merged = xunit2.JUnitXml.fromfile(str(out))
    print(
        f"merged {len(args.merge)} file(s) into {out}: {merged.tests} test cases, "
        f"{merged.failures} failures, {merged.errors} errors"
    )
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from soakmatrix.reports.history import HistoryStore, StoreError
    from soakmatrix.reports.state import cell_states, signature_summaries
    from soakmatrix.reports.tables import attention_table, bisections_table, runs_table, signatures_table

    store_path = Path(args.store)
    known = _known_issues(args.known_issues)
    try:
        store = HistoryStore(store_path, create=False)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    with store:
        if args.refingerprint:
            from soakmatrix.matrix.refingerprint import refingerprint, summary

            sys.stdout.write(summary(refingerprint(store)) + "\n")
        runs = store.runs()
        run_ids = [r.id for r in runs]
        if args.run and args.run not in run_ids:
            known = ", ".join(run_ids[-5:]) or "none"
            raise UsageError(f"{store_path}: no run {args.run!r} (latest runs: {known})")
        observations = store.observations()
        states = cell_states(run_ids, observations)
        out = _Redacting(sys.stdout)  # a store written by an older version may hold a URL's password
        out.write(f"{store_path}: {len(runs)} run(s), {len(states)} cell(s)\n\nruns\n")
        out.write(runs_table(runs, observations) if runs else "no runs yet\n")
        out.write("\ncells that need a look (nights: . passed, H hang, C crash, X config error, i infra error)\n")
        out.write(attention_table(states, store.cells(), limit=args.limit))
        out.write("\nhang and crash signatures (MTTF pooled over all exposure of the cells hit)\n")
        out.write(signatures_table(signature_summaries(run_ids, observations)))
        from soakmatrix.reports.findings import findings
        from soakmatrix.reports.tables import findings_table

        out.write("\nfindings (one per fingerprint: the culprit's frames; MTTF pooled over the cells hit)\n")
        out.write(findings_table(findings(store, known, runs)))
        out.write("\nbisections\n")
        out.write(bisections_table(store.bisections()))
        if args.junit:
            run = _pick_run(runs, args.run)
            if run is None:
                raise UsageError(f"{store_path}: no run to write JUnit for")
            from soakmatrix.reports.junit import write_junit

            props = {
                "run_id": run.id,
                "matrix": redact_text(run.matrix),
                "profile": run.profile,
                "kind": run.kind,
                **{f"meta.{k}": redact_text(str(v)) for k, v in sorted(run.meta.items())},
            }
            path = _writing(
                "--junit",
                args.junit,
                lambda: write_junit(
                    store.results(run.id),
                    args.junit,
                    suite_name=f"soakmatrix.{run.profile}",
                    properties=props,
                    known_issues=known,
                ),
            )
            out.write(f"\nJUnit for run {run.id}: {path}\n")
    if args.out:
        from soakmatrix.reports.dashboard import build_dashboard

        page = _writing("--out", args.out, lambda: build_dashboard(store_path, args.out, known_issues=known))
        sys.stdout.write(f"dashboard: {page}\n")
    return EXIT_OK


class _Redacting:
    """A text stream whose every write passes through `redact_text`."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(redact_text(text))


def _known_issues(path):
    if not path:
        return ()
    from soakmatrix.matrix.contracts.yamlsrc import SpecError
    from soakmatrix.reports.known_issues import load_known_issues

    try:
        return load_known_issues(path)
    except SpecError as exc:
        raise UsageError(f"bad known issues file:\n{exc}") from None


def _pick_run(runs, run_id):
    if run_id:
        return next(r for r in runs if r.id == run_id)
    for run in reversed(runs):
        if run.recorded:
            return run
    return runs[-1] if runs else None
