"""The watch's side effects around the pure loop: observe, decide, probe, keep evidence, report.

Observation is the soak's `Watchdog` (its /metrics scraper and /health threads, `observe_once`), with
the canary as its load and our log source as its log; the detectors are fed by `loop.WatchLoop`, not
by the watchdog. Each incident goes to the `on_incident` callback (the CLI stores it in the history
store: jobs/ never imports reports/), and the watch goes on until `stop` is set or `until` passes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from soakmatrix.jobs.watchdog import Watchdog, WatchdogConfig, http_get

from .canary import Canary
from .detectors import build_watch_detectors
from .incident import Incident, IncidentOptions, handle
from .loop import LoopConfig, Observation, Step, WatchLoop
from .metrics import WatchMetrics
from .target import Target


@dataclass(frozen=True)
class WatchOptions:
    loop: LoopConfig = LoopConfig()
    probe: WatchdogConfig = WatchdogConfig(tick_s=0.5, scrape_every_s=1.0, scrape_timeout_s=5.0,
                                           health_every_s=2.0, health_timeout_s=3.0)
    canary_tokens: int = 4
    model: str | None = None              # default: the first of /v1/models
    threshold: dict | None = None         # StallThreshold options of the passive detectors
    max_incidents: int | None = None      # stop after this many (tests, benchmarks)


class Watcher:
    def __init__(self, target: Target, incident_options: IncidentOptions, *, log: Any = None,
                 options: WatchOptions = WatchOptions(), metrics: WatchMetrics | None = None,
                 on_incident: Callable[[Incident], None] | None = None,
                 on_note: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.target, self.incident_options, self.options, self.clock = target, incident_options, options, clock
        self.metrics = metrics or WatchMetrics()
        self.on_incident = on_incident or (lambda incident: None)
        self.note = on_note or (lambda text: None)
        self.log = log
        self.canary = Canary(target.base_url, model=options.model, max_tokens=options.canary_tokens, clock=clock)
        self.canary.on_done = self.metrics.canary_done
        self.loop = WatchLoop(lambda: build_watch_detectors(threshold=options.threshold), options.loop)
        self.dog = Watchdog(target, self.canary, detectors=[], config=options.probe, clock=clock, get=http_get)
        self.dog.log = log
        self.incidents: list[Incident] = []
        self.started_at = clock()
        self.state = "starting"

    def run(self, stop: threading.Event | None = None, until: float | None = None) -> list[Incident]:
        """Watch until `stop` is set, `until` (time.monotonic()) passes or max_incidents are found."""
        stop = stop or threading.Event()
        self.dog.start()
        try:
            while not stop.is_set() and (until is None or time.monotonic() < until):
                self.tick()
                limit = self.options.max_incidents
                if limit is not None and len(self.incidents) >= limit:
                    break
                stop.wait(self.options.probe.tick_s)
        finally:
            self.canary.abort()
            self.dog.close()
        return self.incidents

    def tick(self) -> Step:
        tick = self.dog.observe_once()
        health = self.dog.health[-1][1] if self.dog.health else None
        del self.dog.health[:-10]   # a watch runs for months: keep the latest probes only
        step = self.loop.step(Observation(tick, health=health))
        if step.abort_canary:
            self.canary.abort()
        if step.note:
            self.note(step.note)
        if step.state != self.state:
            if {step.state, self.state} & {"down", "hung", "starting"}:
                self.note(f"state {self.state} -> {step.state}")
            if step.state != "down" and (self.state in ("starting", "down") or self.target.pid is None):
                self.target.resolve()   # after a restart the server has new pids
            self.state = step.state
        self.metrics.observe(step.state, step.seconds_since_progress)
        if step.verdict is not None:
            self._incident(step, tick.metrics.running if tick.metrics else None)
        if step.send_canary:
            self.canary.send()
        return step

    def _incident(self, step: Step, running: float | None) -> None:
        verdict = step.verdict
        assert verdict is not None
        self.note(f"{verdict.kind.upper()} detected by {verdict.detector}: {verdict.message}")
        lines = list(self.log.recent) if self.log is not None and hasattr(self.log, "recent") else []
        if self.log is not None:
            lines += self.log.new_lines()   # the lines written since the last tick belong to it too
        model = self.canary.model or self._model()
        incident = handle(verdict, self.target, lines, self.incident_options, model=model,
                          watch_started=self.started_at, running=running)
        for n in incident.notes:
            self.note(f"evidence: {n}")
        self.metrics.incident(incident.result.signature, verdict.detector, verdict.at)
        self.incidents.append(incident)
        self.note(f"incident kept in {incident.folder}: {incident.result.outcome.value} "
                  f"signature {incident.result.signature} fingerprint {incident.result.fingerprint} "
                  f"(evidence {incident.evidence.seconds:.1f} s)")
        self.on_incident(incident)

    def _model(self) -> str:
        try:
            return self.canary.discover_model()
        except Exception:   # the server may be gone: the incident is still worth keeping
            return ""
