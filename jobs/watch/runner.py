"""The watch's side effects around the pure loop: observe, decide, probe, keep evidence, report.

Observation is the soak's `Watchdog` (its /metrics scraper and /health threads, `observe_once`), with
the canary as its load and our log source as its log; the detectors are fed by `loop.WatchLoop`, not
by the watchdog. Each incident goes to the `on_incident` callback (the CLI stores it in the history
store: jobs/ never imports reports/), and the watch goes on until `stop` is set or `until` passes.
Every request (the scrape, /health, the canary, the evidence's snapshot) is bounded by `HttpLimits`
and reports its outcome to one `Reachability`, which the loop reads for "unanswered" and "refused"
and which puts each endpoint's trouble in the notes when it changes. Notes pass through the
redaction (`matrix/contracts/redact.py`): a URL's password never reaches stdout or the log.
"""

from __future__ import annotations

import functools
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil

from soakmatrix.jobs.evidence import capture
from soakmatrix.jobs.watchdog import Watchdog, WatchdogConfig
from soakmatrix.matrix.contracts.redact import redact_text

from .bounded_http import HttpLimits, Reachability, RequestFailed, fetch
from .canary import Canary
from .detectors import PASSIVE_THRESHOLD, build_watch_detectors
from .incident import Incident, IncidentOptions, handle
from .loop import LoopConfig, Observation, Step, WatchLoop
from .metrics import WatchMetrics
from .target import Target


@dataclass(frozen=True)
class WatchOptions:
    loop: LoopConfig = LoopConfig()
    probe: WatchdogConfig = WatchdogConfig(
        tick_s=0.5, scrape_every_s=1.0, scrape_timeout_s=5.0, health_every_s=2.0, health_timeout_s=3.0
    )
    canary_tokens: int = 4
    model: str | None = None  # default: the first of /v1/models
    threshold: dict | None = None  # StallThreshold options of the passive detectors
    max_incidents: int | None = None  # stop after this many (tests, benchmarks)
    limits: HttpLimits = HttpLimits()  # deadline and size cap of every request (the probe's timeouts follow)


class Watcher:
    def __init__(
        self,
        target: Target,
        incident_options: IncidentOptions,
        *,
        log: Any = None,
        options: WatchOptions = WatchOptions(),
        metrics: WatchMetrics | None = None,
        on_incident: Callable[[Incident], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target, self.incident_options, self.options, self.clock = target, incident_options, options, clock
        self.metrics = metrics or WatchMetrics()
        self.on_incident = on_incident or (lambda incident: None)
        user_note = on_note or (lambda text: None)
        self.note = lambda text: user_note(redact_text(text))
        self.log = log
        self.limits = limits = options.limits
        self.reach = Reachability(answered_at=clock())
        ceiling = float((options.threshold or {}).get("ceiling_s", PASSIVE_THRESHOLD["ceiling_s"]))
        canary_limits = replace(limits, canary_s=max(limits.canary_s, 2 * ceiling))
        self.canary = Canary(
            target.base_url,
            model=options.model,
            max_tokens=options.canary_tokens,
            limits=canary_limits,
            clock=clock,
            on_outcome=self.reach.record,
        )
        self.canary.on_done = self.metrics.canary_done
        self.loop = WatchLoop(lambda: build_watch_detectors(threshold=options.threshold), options.loop)
        probe = replace(options.probe, scrape_timeout_s=limits.metrics_s, health_timeout_s=limits.health_s)
        self.dog = Watchdog(target, self.canary, detectors=[], config=probe, clock=clock, get=self.get)
        self.dog.log = log
        self.capture = functools.partial(capture, scrape=self.scrape)
        self.incidents: list[Incident] = []
        self.started_at = clock()
        self.state = "starting"
        self._problems: dict[str, str] = {}

    def get(self, url: str, timeout_s: float) -> tuple[int, str]:
        """The watchdog's GET, bounded by the path's limits (`timeout_s` is the same deadline), its
        outcome reported; a failure raises (refused and reset as `ConnectionRefusedError`)."""
        deadline, cap = self.limits.for_path(urllib.parse.urlsplit(url).path)
        try:
            resp, outcome = fetch(url, deadline, cap, limits=self.limits, clock=self.clock)
        except RequestFailed as exc:
            self.reach.record(exc.outcome)
            raise
        self.reach.record(outcome)
        return resp.status, resp.body.decode("utf-8", "replace")

    def scrape(self, url: str, timeout_s: float) -> str:
        """The evidence's /metrics snapshot: bounded like the scrape, not reported (not detection)."""
        resp, _ = fetch(
            url, self.limits.evidence_metrics_s, self.limits.metrics_bytes, limits=self.limits, clock=self.clock
        )
        if resp.status != 200:
            raise ValueError(f"/metrics answered HTTP {resp.status}")
        return resp.body.decode("utf-8", "replace")

    def run(self, stop: threading.Event | None = None, until: float | None = None) -> list[Incident]:
        """Watch until `stop` is set, `until` (time.monotonic()) passes or max_incidents are found."""
        stop = stop or threading.Event()
        self.reach.answered_at = self.clock()  # silence is counted from the start of the watch
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
        del self.dog.health[:-10]  # a watch runs for months: keep the latest probes only
        answered_at, unanswered, unreachable = self.reach.take()
        step = self.loop.step(
            Observation(
                tick,
                health=health,
                refused=unreachable is not None,
                answered_at=answered_at,
                unanswered=f"{unanswered.path}: {unanswered.detail}" if unanswered else None,
            )
        )
        self._note_problems()
        if step.abort_canary:
            self.canary.abort()
        if step.note:
            self.note(step.note)
        if step.state != self.state:
            if {step.state, self.state} & {"down", "hung", "starting"}:
                self.note(f"state {self.state} -> {step.state}")
            pid = self.target.pid if self.target.pid is not None else self.target.given_pid
            if step.state == "down" and pid is not None:
                gone = not psutil.pid_exists(pid)
                self.note(
                    f"pid {pid} {'is gone: the server exited' if gone else 'still runs'}"
                    f"{' (its log tells a stop from a crash)' if gone else ' and refuses connections'}"
                )
            if step.state != "down" and (self.state in ("starting", "down") or self.target.pid is None):
                self.target.resolve()  # after a restart the server has new pids
            self.state = step.state
        self.metrics.observe(step.state, step.seconds_since_progress)
        if step.verdict is not None:
            self._incident(step, tick.metrics.running if tick.metrics else None)
        if step.send_canary:
            self.canary.send()
        return step

    def _note_problems(self) -> None:
        """A line when an endpoint's trouble starts, changes or ends: not one per request."""
        now = self.reach.problems()
        for path in sorted(set(now) | set(self._problems)):
            if now.get(path) != self._problems.get(path):
                self.note(f"{path}: {now[path]}" if path in now else f"{path}: answering again")
        self._problems = now

    def _incident(self, step: Step, running: float | None) -> None:
        verdict = step.verdict
        assert verdict is not None
        self.note(f"{verdict.kind.upper()} detected by {verdict.detector}: {verdict.message}")
        lines = list(self.log.recent) if self.log is not None and hasattr(self.log, "recent") else []
        if self.log is not None:
            lines += self.log.new_lines()  # the lines written since the last tick belong to it too
        # a server that answers nothing would only hold the evidence up by another deadline
        model = self.canary.model or ("" if verdict.detector == "unanswered" else self._model())
        incident = handle(
            verdict,
            self.target,
            lines,
            self.incident_options,
            model=model,
            watch_started=self.started_at,
            running=running,
            capture_fn=self.capture,
        )
        for n in incident.notes:
            self.note(f"evidence: {n}")
        self.metrics.incident(incident.result.signature, verdict.detector, verdict.at)
        self.incidents.append(incident)
        self.note(
            f"incident kept in {incident.folder}: {incident.result.outcome.value} "
            f"signature {incident.result.signature} fingerprint {incident.result.fingerprint} "
            f"(evidence {incident.evidence.seconds:.1f} s)"
        )
        self.on_incident(incident)

    def _model(self) -> str:
        try:
            return self.canary.discover_model()
        except Exception:  # noqa: BLE001 - the server may be gone: the incident is still worth keeping
            return ""
