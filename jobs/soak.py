"""`run_cell`: soak one cell on this node and say what happened, as a `CellResult`.

engine -> launch (own process group, readiness) -> load (seeded streams) -> watchdog (detectors)
-> on a verdict: evidence, then classification -> teardown (leak check) -> `result.json`.
Engine trouble never raises: it becomes an outcome. Only `stop` (cancellation by the scheduler)
cuts a cell short, as `infra_error("cancelled")`. For the simulated engine every duration in the
result (exposure, time to hang) is in engine time, i.e. wall seconds times `spec.time_scale`, so
they compare with the hang model's MTTFs; `detected_after_s` is always wall seconds.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakmatrix.jobs.detect.protocol import Detector, HangVerdict, build_detectors
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

from . import evidence as evidence_mod
from . import server_process, teardown
from .artifacts import scrub_result, seal, secrets_of
from .engines import Engine, get_engine
from .hang_confirmation import ConfirmationWindow, confirm, needs_confirmation
from .load import LoadDriver
from .soak_spec import SoakSpec, effective_time_scale
from .verdict_result import record_exposure, record_finding, record_stall, stalls_summary
from .watchdog import Watchdog, WatchdogConfig

EventSink = Callable[[str, dict], None]
PORT_RETRIES = 2  # a port race at start-up is retried in place, not reported


@dataclass(frozen=True)
class SoakOptions:
    """Knobs tests and benchmarks turn; the defaults are what a nightly soak uses."""

    watchdog: WatchdogConfig = WatchdogConfig()
    detector_options: Mapping[str, Mapping[str, Any]] | None = None
    detector_names: Sequence[str] | None = None
    drain_s: float = 30.0  # after the soak: in-flight requests may finish (and hang) this long
    teardown_grace_s: float = 10.0
    pyspy_timeout_s: float = 20.0
    # how long a hang must outlast its verdict (None: every verdict stands, as before 2026-11-29)
    confirmation: ConfirmationWindow | None = ConfirmationWindow()
    log_lines_for_classifier: int = 5000
    state_dir: str | None = None  # where leaks are carried to the next cell; default: the cells folder


def run_cell(
    spec: SoakSpec,
    *,
    stop: threading.Event | None = None,
    on_event: EventSink | None = None,
    engine: Engine | None = None,
    options: SoakOptions = SoakOptions(),
) -> CellResult:
    stop = stop or threading.Event()
    emit = _safe(on_event)
    folder = Path(spec.artifacts_dir)
    folder.mkdir(parents=True, exist_ok=True)
    _archive_previous(folder)
    result = CellResult(
        cell_id=spec.cell_id,
        cell_name=spec.cell_name,
        outcome=Outcome.INFRA_ERROR,
        model=spec.model,
        gpu_type=spec.gpu_type,
        workload=spec.workload.name,
        flags=dict(spec.flags),
        node=socket.gethostname(),
        gpu_count=spec.gpu_count,
        engine=spec.backend,
        attempt=spec.attempt,
        build=spec.build,
        build_ordinal=spec.build_ordinal,
        python=sys.executable,
    )
    state_dir = options.state_dir or str(folder.parent)
    try:
        problem = teardown.preflight(state_dir)
        if problem:
            result.message = problem
            emit("infra_error", {"message": problem})
            return result
        engine = engine or get_engine(spec.backend)
        result.vllm_version = _version(engine)
        _soak(spec, engine, result, stop, emit, options, state_dir)
    except Exception as exc:  # noqa: BLE001 - a bug of ours or of the node: no verdict, retried by the scheduler
        result.outcome = Outcome.INFRA_ERROR
        result.message = f"soak job error: {type(exc).__name__}: {exc}"
        path = folder / "soak-error.txt"
        path.write_text(traceback.format_exc())
        result.artifacts["soak_error"] = str(path)
    finally:
        result.ended_at = time.time()
        secrets = secrets_of((*spec.serve_args, spec.model_path), spec.env)
        scrub_result(result, secrets)
        _write_result(folder, result)
        seal(folder, secrets)
        emit("done", {"outcome": result.outcome.value, "message": result.message})
    return result


def _soak(
    spec: SoakSpec,
    engine: Engine,
    result: CellResult,
    stop: threading.Event,
    emit: EventSink,
    options: SoakOptions,
    state_dir: str,
) -> None:
    folder = Path(spec.artifacts_dir)
    scale = effective_time_scale(spec.backend, spec.time_scale)
    emit("launching", {"engine": engine.name, "artifacts": str(folder)})
    server = server_process.launch(engine, spec)
    result.artifacts["server_log"] = str(server.log_path)
    result.artifacts["command"] = str(folder / "command.txt")
    load: LoadDriver | None = None
    dog: Watchdog | None = None
    try:
        failure = server.wait_ready(spec.startup_timeout_s, stop)
        for _ in range(PORT_RETRIES):
            if not server_process.port_taken(failure):
                break
            # another process took the free port between our pick and the server's bind: new port
            server.stop(grace_s=options.teardown_grace_s)
            server = server_process.launch(engine, spec)
            failure = server.wait_ready(spec.startup_timeout_s, stop)
        if failure is not None:
            result.outcome = failure.outcome
            result.message = failure.message
            result.log_tail = server.log_tail(50)
            return
        result.startup_s = round((server.ready_at or time.time()) - server.started_at, 2)
        emit("ready", {"base_url": server.base_url, "startup_s": result.startup_s})

        wall_soak = spec.soak_s / scale
        load = LoadDriver(server.base_url, spec.workload, seed=spec.seed, duration_s=wall_soak)
        detectors = _detectors(options)
        dog = Watchdog(server, load, detectors, options.watchdog, artifacts_dir=folder).start()
        load.start()
        load_start, mono0 = time.time(), time.monotonic()
        emit("load", {"workload": spec.workload.name, "wall_s": wall_soak})
        watch = _HangWatch(dog, load, server, folder, result, emit, options, stop)
        verdict, ev = watch.until(mono0 + wall_soak, done=lambda: load.finished)
        if verdict is None and not stop.is_set():
            load.stop_sending()  # the soak is over; what is still in flight may yet hang
            verdict, ev = watch.until(
                time.monotonic() + options.drain_s, done=lambda: load.finished or load.snapshot().open_streams == 0
            )
        now = time.time()
        stats = load.stats.summary()
        result.tokens, result.requests = int(stats["tokens"]), int(stats["completed"])
        result.load = stats
        load_start = _first_request_sent(load, load_start, result)
        record_exposure(result, load_start, verdict, now, scale)
        result.health = _health_summary(dog.health)

        if stop.is_set():
            result.outcome, result.message = Outcome.INFRA_ERROR, "cancelled"
            return
        if verdict is None or ev is None:
            _passed(result, stats)
            _attach_sim_record(result, folder)  # a simulated hang no detector saw shows up here
            return
        load.stop(timeout_s=5)
        # how long the stacks took says whether a missing culprit was the engine dying meanwhile
        result.evidence_s = round(ev.seconds, 2)
        emit("evidence", {"artifacts": sorted(ev.artifacts), "seconds": round(ev.seconds, 1)})
        log_lines = server.log_text(4_000_000).splitlines()[-options.log_lines_for_classifier :]
        record_finding(
            result,
            verdict,
            ev,
            log_lines,
            server.poll(),
            load_start,
            scale,
            dog.last_sample.running if dog.last_sample else None,
        )
        _attach_sim_record(result, folder)
    finally:
        if load is not None:
            load.stop(timeout_s=5)
        if dog is not None:
            dog.close()
        report = server.stop(grace_s=options.teardown_grace_s)
        result.teardown = {
            "clean": report.clean,
            "pids": report.pids,
            "survivors": report.survivors,
            "port_listening": report.port_listening,
            "gpu_pids": report.gpu_pids,
            "escalated": report.escalated,
            "seconds": round(report.seconds, 2),
        }
        emit("teardown", {"clean": report.clean, "detail": report.describe()})
        if not report.clean:
            teardown.record_leak(state_dir, spec.cell_id, report, server.port)
            result.leak = report.describe()
        if not result.log_tail:
            result.log_tail = server.log_tail(50)


class _HangWatch:
    """The watchdog's verdicts, each with its evidence, until one stands: a hang verdict after which
    a token still reached the client was a stall (a starved host, a slow step), not a hang. Stalls
    are kept in `result.stalls` (the first few with their stacks) and the watch goes on."""

    def __init__(
        self,
        dog: Watchdog,
        load: LoadDriver,
        server: Any,
        folder: Path,
        result: CellResult,
        emit: EventSink,
        options: SoakOptions,
        stop: threading.Event,
    ) -> None:
        self.dog, self.load, self.server, self.folder, self.result = dog, load, server, folder, result
        self.emit, self.options, self.stop = emit, options, stop

    def until(
        self, deadline: float, done: Callable[[], bool]
    ) -> tuple[HangVerdict | None, evidence_mod.Evidence | None]:
        """(verdict, its evidence) or (None, None) at `deadline` (time.monotonic()), `done()` or stop."""
        while True:
            verdict = self.dog.watch(until=deadline, stop=self.stop, done=done)
            if verdict is None or self.stop.is_set():
                return None, None
            self.emit("verdict", {"detector": verdict.detector, "kind": verdict.kind, "message": verdict.message})
            # the stacks before anything else: confirming or stopping the load takes seconds, and an
            # engine may die of its own timeout meanwhile (vLLM's RPC timeout after an shm hang)
            ev = evidence_mod.capture(
                self.server, self.folder / "evidence", pyspy_timeout_s=self.options.pyspy_timeout_s, stop=self.stop
            )
            window = self.options.confirmation
            if (
                window is None
                or not needs_confirmation(verdict)
                or confirm(verdict, self.load.snapshot, time.time(), window)
            ):
                return verdict, ev
            self._stall(verdict, ev)

    def _stall(self, verdict: HangVerdict, ev: evidence_mod.Evidence) -> None:
        stall = record_stall(
            self.result.stalls, verdict, ev, self.load.snapshot().last_token_at, self.folder / "stalls"
        )
        self.emit("stall", {"detector": verdict.detector, "silent_s": stall["silent_s"]})


def _first_request_sent(load: LoadDriver, driver_started: float, result: CellResult) -> float:
    """Where exposure starts: the first request sent, not the driver's start. Model discovery and
    the driver's own start-up are not load; at the simulated engine's time scale a wall second of
    them reads as minutes the engine survived, and a busy machine stretches them. Without a request
    sent (discovery failed), the driver's start."""
    sent = load.stats.started_at
    if sent is None:
        return driver_started
    result.load_start_delay_s = round(max(0.0, sent - driver_started), 3)
    return max(sent, driver_started)


def _detectors(options: SoakOptions) -> list[Detector]:
    if options.detector_names is None:
        return build_detectors(options=options.detector_options)
    return build_detectors(options.detector_names, options.detector_options)


def _passed(result: CellResult, stats: Mapping[str, Any]) -> None:
    if stats["completed"] == 0:
        # no request ever finished and no detector fired: we learned nothing about this cell
        errors = ", ".join(f"{k} x{v}" for k, v in stats["errors"].items()) or "none"
        result.outcome = Outcome.INFRA_ERROR
        result.message = f"no request completed under load (errors: {errors})"
        return
    result.outcome = Outcome.PASSED
    result.message = (
        f"no hang in {result.exposure_s:.0f} s under load: {result.requests} requests, {result.tokens} tokens"
    )
    result.message += stalls_summary(result.stalls)


def _health_summary(health: Sequence[tuple[float, int | None]]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for _, status in health:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return {"probes": len(health), "status_counts": counts, "last": health[-1][1] if health else None}


def _attach_sim_record(result: CellResult, folder: Path) -> None:
    """The simulated engine writes when each hang truly began: keep it next to the verdict."""
    record = folder / "sim-hangs.jsonl"
    if not record.exists():
        return
    result.artifacts["sim_hangs"] = str(record)
    try:
        hangs = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    except ValueError:
        return
    if hangs:
        result.true_hang = hangs[0]
        verdict_at = result.verdict.get("at")
        if verdict_at and "began_at" in hangs[0]:
            result.latency_from_true_start_s = round(verdict_at - float(hangs[0]["began_at"]), 2)


def _archive_previous(folder: Path) -> None:
    """An earlier attempt's files (a retry reuses the cell's folder) move to `previous-N/`, so its
    log and hang record are neither lost nor read as this attempt's."""
    old = [p for p in folder.iterdir() if not p.name.startswith("previous-")]
    if not old:
        return
    n = 1 + sum(1 for p in folder.iterdir() if p.name.startswith("previous-"))
    target = folder / f"previous-{n}"
    target.mkdir()
    for p in old:
        p.rename(target / p.name)


def _version(engine: Engine) -> str:
    try:
        return engine.version()
    except Exception as exc:  # noqa: BLE001 - an engine that cannot say its version still soaks
        return f"unknown ({type(exc).__name__})"


def _safe(sink: EventSink | None) -> EventSink:
    def emit(kind: str, data: dict) -> None:
        if sink is None:
            return
        try:
            sink(kind, data)
        except Exception:  # noqa: BLE001 - a broken listener must not change a cell's outcome
            pass

    return emit


def _write_result(folder: Path, result: CellResult) -> None:
    path = folder / "result.json"
    result.artifacts.setdefault("result", str(path))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(result.to_json())
    tmp.replace(path)
