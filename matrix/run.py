"""Running a list of planned cells on Ray and recording each result as it comes: the core of the
API's `soakmatrix.run`, which `soakmatrix run` and `soakmatrix smoke` call (they only choose the cells).

Each finished cell goes to the history store at once (a driver crash loses nothing; `--resume`
reruns only cells without a verdict), the JUnit file is rewritten at most every 2 s and the
dashboard at most every 30 s, and both at the end, also when the Ray cluster was lost mid-run
(exit 3 unless a finding outranks it; the run stays open for `--resume`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.outcomes import EXIT_INFRA, EXIT_OK, Outcome, exit_code
from soakmatrix.matrix.contracts.redact import redact_argv, redact_text
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.contracts.yamlsrc import Problem, SpecError

from .lasting_stream import divert_stderr
from .plan import PlannedCell, planned_dicts
from .progress import Progress
from .run_types import RunOptions, RunResult
from .soak_specs import matrix_time_scale, soak_spec_for
from .spec import Matrix, Profile
from .stop_signals import StopSignals, signal_name

JUNIT_EVERY_S = 2.0  # after a SIGKILL, JUnit misses at most the last seconds' cells
DASHBOARD_EVERY_S = 30.0
EXIT_INTERRUPTED = 130


def add_run_options(parser: argparse.ArgumentParser, default_profile: str = "the first") -> None:
    from .arguments import text
    from .paths import CONFIG_FILE, output_dir, output_file

    parser.add_argument("matrix", type=CONFIG_FILE, help="matrix YAML file")
    parser.add_argument("--profile", type=text, help=f"profile name (default: {default_profile})")
    parser.add_argument(
        "--backend",
        choices=("sim", "vllm"),
        default="sim",
        help="engine: the simulated vLLM server (default) or real `vllm serve`",
    )
    parser.add_argument(
        "--ray-address", type=text, help="Ray cluster to use (default: $RAY_ADDRESS, else a local cluster)"
    )
    parser.add_argument("--out", type=output_dir, help="output folder (default: out/<matrix name>)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the latest unfinished run of this matrix and profile: cells with a verdict are not rerun",
    )
    parser.add_argument("--store", type=output_file, help="history store (default: <out>/history.sqlite)")


def say_rejected(rejected: Any) -> None:
    """A cell vLLM's parser refused (`--backend vllm`): it can only end as config_error, so it is skipped."""
    print(f"skipped, rejected by vLLM: {rejected.combo}: {rejected.reason}", file=sys.stderr)


def out_dir_of(matrix: Matrix, out: str | None) -> Path:
    return Path(out or Path("out") / matrix.name).resolve()


def verdict_ids(results: Sequence[CellResult]) -> set[str]:
    """Cells a resumed run skips: those with a verdict. An infra error is no verdict (the cell
    may well run now: a node came back, the cluster grew), so it runs again."""
    latest: dict[str, CellResult] = {}
    for r in results:
        if r.cell_id not in latest or r.ended_at >= latest[r.cell_id].ended_at:
            latest[r.cell_id] = r
    return {cid for cid, r in latest.items() if r.outcome is not Outcome.INFRA_ERROR}


class ResultSink:
    """Implements schedule.Events for the results: the store first, at every cell (nothing finished is
    lost); JUnit at most every JUNIT_EVERY_S and the dashboard at most every DASHBOARD_EVERY_S (each
    rewrite reads the whole run, so writing both per cell would grow with the square of the cells)."""

    def __init__(
        self,
        store: Any,
        run_id: Any,
        store_path: Path,
        out: Path,
        suite: str,
        properties: dict[str, str],
        clock=time.time,
    ):
        self.store, self.run_id, self.store_path, self.out = store, run_id, store_path, out
        self.suite, self.properties, self.clock = suite, properties, clock
        self.junit_path = out / "junit.xml"
        self.dashboard_dir = out / "dashboard"
        self._dashboard_at = 0.0
        self._junit_at = 0.0
        self._junit_stale = self._dashboard_stale = False
        self.warnings: list[str] = []
        self._regressions: Any = None  # reports.regressions.RunRegressions, once a cell ran on a build

    def cell_started(self, pc: PlannedCell, attempt: int, node: str) -> None:
        pass

    def cell_retrying(self, pc: PlannedCell, result: CellResult) -> None:
        pass

    def cell_finished(self, pc: PlannedCell, result: CellResult) -> None:
        self.store.record(self.run_id, result)
        self._junit_stale = self._dashboard_stale = True
        self.tick()

    def tick(self) -> None:
        now = self.clock()
        if self._junit_stale and now - self._junit_at >= JUNIT_EVERY_S:
            self.write_junit()
        if self._dashboard_stale and now - self._dashboard_at >= DASHBOARD_EVERY_S:
            self.write_dashboard()

    def write_junit(self) -> bool:
        """Rewrites the run's JUnit; False when it could not be written (a full or read-only disk):
        the soak goes on, the store keeps every result, and the run's exit code says so at its end."""
        from soakmatrix.reports.junit import write_junit

        self._junit_at, self._junit_stale = self.clock(), False
        results = self.store.results(self.run_id)
        if any(r.build for r in results):  # cells on engine builds: regressions against the whole history
            from soakmatrix.reports.regressions import RunRegressions

            self._regressions = self._regressions or RunRegressions(self.store, self.run_id)
            results = self._regressions.annotate(results)
        try:
            write_junit(results, self.junit_path, self.suite, properties=self.properties)
        except OSError as exc:
            warning = f"JUnit not written to {self.junit_path}: {exc.strerror or exc}"
            if warning not in self.warnings:
                self.warnings.append(warning)
            return False
        return True

    def write_dashboard(self) -> Path | None:
        from soakmatrix.reports.dashboard import build_dashboard

        self._dashboard_at, self._dashboard_stale = self.clock(), False
        try:
            return build_dashboard(self.store_path, self.dashboard_dir)
        except Exception as exc:  # noqa: BLE001 - a report failing must not stop the soak
            self.warnings.append(f"dashboard not written: {type(exc).__name__}: {exc}")
            return None


class Fanout:
    """Several Events listeners as one."""

    def __init__(self, *listeners: Any):
        self.listeners = listeners

    def __getattr__(self, name: str):
        def call(*args: Any) -> None:
            for listener in self.listeners:
                getattr(listener, name)(*args)

        return call


def run_planned(
    matrix: Matrix,
    profile: Profile,
    cells: Sequence[PlannedCell],
    options: RunOptions,
    *,
    kind: str = "run",
    fail_fast: bool = False,
    keep_order: bool = False,
    stream: TextIO | None = None,
    listener: Any = None,
) -> RunResult:
    """Run `cells` of `profile` on Ray, recording each result; the exit code is 130 or 143 when SIGINT
    or SIGTERM stopped it (the run stays unfinished, and `--resume` continues it). `listener`
    (schedule.Events) hears every cell start, retry and result beside the progress display."""
    stream = stream or sys.stderr
    with StopSignals() as stop_signals:
        return _execute(matrix, profile, cells, options, kind, fail_fast, keep_order, stream, stop_signals, listener)


def _execute(
    matrix: Matrix,
    profile: Profile,
    cells: Sequence[PlannedCell],
    args: RunOptions,
    kind: str,
    fail_fast: bool,
    keep_order: bool,
    stream: TextIO,
    stop_signals: StopSignals,
    listener: Any,
) -> RunResult:
    from soakmatrix.matrix.schedule.cluster import CONNECT_ERRORS, address_from, cannot_reach, connect
    from soakmatrix.reports.history import HistoryStore, StoreError

    from .schedule import RayLauncher, cap_seconds, cluster_lost, infra_result, run_cells, unplaceable

    out = out_dir_of(matrix, args.out)
    out.mkdir(parents=True, exist_ok=True)
    divert_stderr(out / "progress.log")  # where progress goes if stderr's reader goes away
    store_path = Path(args.store).resolve() if args.store else out / "history.sqlite"
    address = address_from(args.ray_address)
    try:
        store = HistoryStore(store_path)
    except StoreError as exc:  # before any cell runs: a usage error, nothing is lost
        raise SpecError([Problem(str(store_path), 0, "--store", str(exc).removeprefix(f"{store_path}: "))]) from exc
    status = None  # an interrupted or crashed run stays unfinished, so `--resume` finds it
    run_id = None

    def answer(code: int, **more: Any) -> RunResult:
        results = tuple(store.results(run_id)) if run_id is not None and "results" not in more else ()
        return RunResult(code, run_id, out, store_path, **{"results": results, **more})

    try:
        run_id = store.start_run(
            matrix=matrix.name,
            profile=profile.name,
            kind=kind,
            resume=args.resume,
            meta={
                "matrix_file": matrix.file,
                "backend": args.backend,
                "ray_address": redact_text(address) if address else "local",
                "argv": redact_argv(sys.argv[1:]),
                "cells": len(cells),
            },
        )
        skip = verdict_ids(store.results(run_id)) if args.resume else set()
        store.planned(run_id, planned_dicts(cells))
        todo = [pc for pc in cells if pc.id not in skip]
        print(
            f"soakmatrix {kind}: {matrix.name}/{profile.name}: {len(cells)} cells"
            + (f", {len(cells) - len(todo)} already have a verdict (resumed run {run_id})" if skip else "")
            + f", soak {format_duration(profile.soak_s)} each; output in {out}",
            file=stream,
        )
        sink = ResultSink(
            store,
            run_id,
            store_path,
            out,
            suite=f"soakmatrix.{matrix.name}.{profile.name}",
            properties={"matrix": matrix.name, "profile": profile.name, "backend": args.backend, "kind": kind},
        )
        recorder = Fanout(sink, listener) if listener is not None else sink

        def make_spec(pc: PlannedCell) -> SoakSpec:
            return soak_spec_for(pc, matrix, args.backend, out)

        scale = matrix_time_scale(matrix, args.backend)
        startup_timeout = make_spec(cells[0]).startup_timeout_s if cells else 0.0
        cap = cap_seconds(profile.soak_s, startup_timeout, profile.cap_s, scale)
        interrupted = stopped_early = False
        try:
            cluster = connect(address, backend=args.backend, gpus=matrix.gpus)
        except CONNECT_ERRORS as exc:
            why = redact_text(cannot_reach(address, exc))
            print(f"soakmatrix {kind}: {why}", file=stream)
            return answer(EXIT_INFRA, unreachable=why)  # no verdict; the run stays unfinished for --resume
        with cluster:
            stop_signals.install()  # again: ray.init put its own handlers in
            print(f"soakmatrix {kind}: on {redact_text(cluster.description)}", file=stream)
            launcher = RayLauncher()
            try:
                nodes = launcher.nodes()
            except Exception as exc:
                if (lost := cluster_lost(exc)) is None:
                    raise
                print(lost_line(kind, lost, 0, len(todo)), file=stream, flush=True)
                return answer(EXIT_INFRA, lost=lost)
            never = unplaceable(todo, nodes)
            for pc in todo:
                if pc.id in never:
                    result = infra_result(make_spec(pc), f"never placed: {never[pc.id]}")
                    recorder.cell_finished(pc, result)
                    print(f"cannot place {pc.name}: {never[pc.id]}", file=stream)
            placeable = [pc for pc in todo if pc.id not in never]
            progress = Progress(len(placeable), stream=stream)
            summary = run_cells(
                placeable,
                make_spec,
                launcher,
                Fanout(recorder, progress),
                retries=profile.retries,
                cap_s=cap,
                fail_fast=fail_fast,
                order=list if keep_order else None,
            )
            progress.close()
            interrupted, stopped_early = summary.interrupted, summary.stopped_early
            if summary.unfinished and not summary.lost:
                print(
                    f"soakmatrix {kind}: {len(summary.unfinished)} cell(s) cancelled before a verdict"
                    + ("; `--resume` runs them" if interrupted else ""),
                    file=stream,
                )
            # written before the cluster is closed: after a lost head, closing takes a while, and Ray
            # ends a driver whose GCS stays unreachable
            status = None if interrupted or summary.lost else "stopped" if stopped_early else "finished"
            results = store.results(run_id)
            junit_written = sink.write_junit()
            dashboard = sink.write_dashboard()
            for warning in sink.warnings:
                print(f"soakmatrix {kind}: {warning}", file=stream)
            print(summary_text(results, sink.junit_path if junit_written else None, dashboard, store_path), file=stream)
            written = {
                "results": tuple(results),
                "junit": sink.junit_path if junit_written else None,
                "dashboard": dashboard,
                "warnings": tuple(sink.warnings),
            }
            if summary.lost:
                print(lost_line(kind, summary.lost, len(results), len(summary.unfinished)), file=stream, flush=True)
                return answer(
                    exit_code([*(r.outcome for r in results), Outcome.INFRA_ERROR]), lost=summary.lost, **written
                )
        if interrupted:
            print(f"soakmatrix {kind}: stopped by {signal_name(stop_signals.received)}", file=stream)
            return answer(stop_signals.exit_code(EXIT_INTERRUPTED), interrupted=True, **written)
        code = exit_code(r.outcome for r in results) if results else EXIT_OK
        # no JUnit is never a pass: a CI job reading it would see nothing and go green
        return answer(EXIT_INFRA if not junit_written and code == EXIT_OK else code, **written)
    finally:
        try:
            if status is not None and run_id is not None:
                store.finish_run(run_id, status)
        finally:
            store.close()


def lost_line(kind: str, why: str, finished: int, unfinished: int) -> str:
    """The one line a run that lost its cluster ends with (no verdict; the run stays open)."""
    return (
        f"soakmatrix {kind}: {why}; {finished} finished cell(s) kept, {unfinished} unfinished; "
        "the run stays open: once the cluster is back, `--resume` runs the unfinished cells"
    )


def summary_text(results: Sequence[CellResult], junit: Path | None, dashboard: Path | None, store: Path) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
    lines = ["results: " + (", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "none")]
    for r in results:
        if r.outcome.is_finding:
            lines.append(f"  {r.outcome.value:<6} {r.cell_name}  {r.signature or ''}")
    if junit:
        lines.append(f"JUnit: {junit}")
    if dashboard:
        lines.append(f"dashboard: {dashboard}")
    lines.append(f"history: {store}")
    return "\n".join(lines)
