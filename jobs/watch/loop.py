"""The watch's decisions, pure: one observation in, the server's state, a verdict and canary orders out.

Side effects (scrapes, the canary's HTTP, the log, the clock) stay in `runner.py`; this module sees a
`Tick` (the soak watchdog's observation, with the canary as its only stream) plus /health and
"connection refused", so every rule below is tested on recorded series.

- Connection refused is `down`, never `hung`: a restart or a stop. The first sample after it starts a
  fresh episode (new detectors, new counter baseline: a restarted server counts from zero).
- Progress is any movement of the server's counters or a canary token. While that proof is fresher
  than `canary_every_s`, real traffic speaks for the engine and no canary is sent; otherwise (idle,
  requests waiting with none running, gauges gone stale, a stall starting) a canary asks.
- A verdict makes the state `hung` until progress resumes (recovered) or the server goes away
  (`down`): one incident per episode, however long the hang lasts.
- A server that takes connections and answers none of them in full (every request of the watch ends
  at its deadline or its size cap, `bounded_http.py`) for longer than the stall threshold is `hung`:
  an API server whose event loop is blocked, a server dripping a byte at a time or streaming without
  end. vLLM listens only once it is ready (its port is bound, unlisted, while it loads), so such a
  silence is never a start-up. Refused or reset connections are `down` instead, and a prompt answer
  of any kind (an error page, a redirect loop) is no silence.
- A bare EngineDeadError line is also printed by an orderly SIGTERM shutdown, so it counts only once
  confirmed: a fatal-error line, /health 5xx or a failing canary. A refusal after it, with no 5xx
  seen, is a stop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from soakmatrix.jobs.detect.protocol import Detector, HangVerdict, StallThreshold, Tick

STATES = ("starting", "idle", "busy", "stale", "hung", "down")
FATAL_LINE = re.compile(r"EngineCore encountered a fatal error|died unexpectedly")


@dataclass(frozen=True)
class LoopConfig:
    canary_every_s: float = 5.0  # probe when the latest proof of progress is older (0: never)
    stale_after_s: float = 5.0  # no /metrics sample for this long: the gauges cannot be trusted
    confirm_dead_s: float = 10.0  # a bare EngineDeadError line needs a 5xx within this long
    # no complete answer for this long, with requests that ran out of time or bytes: a hang (None:
    # the stall detectors' learned threshold, so an unanswering server is held to a silent engine's time)
    unanswered_after_s: float | None = None
    unanswered_default_s: float = 6.0  # the same, when no detector carries a threshold


@dataclass(frozen=True)
class Observation:
    tick: Tick
    health: int | None = None  # the latest /health status (None: not yet, or no answer)
    refused: bool = False  # a connection was refused (or reset) since the last observation
    answered_at: float | None = None  # when the server last answered a request in full (or the watch began)
    unanswered: str | None = None  # the latest request since then that got no usable answer, in words


@dataclass(frozen=True)
class Step:
    state: str
    verdict: HangVerdict | None = None
    send_canary: bool = False
    abort_canary: bool = False
    note: str | None = None  # a state change or a dismissed verdict, worth a log line
    seconds_since_progress: float | None = None


def refused(tick: Tick) -> bool:
    """The scrape's or the canary's connection was refused (nothing listens: stopped or restarting)."""
    if tick.scrape_error and "ConnectionRefused" in tick.scrape_error:
        return True
    return tick.stream is not None and tick.stream.last_error == "refused"


class WatchLoop:
    def __init__(self, detectors: Callable[[], Sequence[Detector]], config: LoopConfig = LoopConfig()) -> None:
        self.make_detectors, self.config = detectors, config
        self.detectors: list[Detector] = list(detectors())
        self.state = "starting"
        self.last_progress_at: float | None = None
        self.last_sample_at: float | None = None
        self.last_canary_at: float | None = None
        self._counters: tuple | None = None
        self._canary_token_at: float | None = None
        self._gauges_busy = False
        self._pending_dead: HangVerdict | None = None
        self._saw_5xx = False

    # ------------------------------------------------------------------ one observation

    def step(self, obs: Observation) -> Step:
        t = obs.tick
        now = t.now
        if obs.refused or refused(t):
            return self._down(now)
        if self.state != "hung":
            silent = self._unanswered(obs, now)
            if silent is not None:
                self.state = "hung"
                return Step("hung", verdict=silent, abort_canary=True, seconds_since_progress=self._since(now))
        moved = self._progress(t)
        if obs.health is not None and obs.health >= 500:
            self._saw_5xx = True
        if t.metrics is not None:
            self.last_sample_at = t.metrics.at
            self._gauges_busy = (t.metrics.running or 0) > 0 or (t.metrics.waiting or 0) > 0
        note = None
        if self.state in ("starting", "down"):
            if t.metrics is None:
                return Step(self.state, seconds_since_progress=self._since(now))
            note = f"server up ({'first sample' if self.state == 'starting' else 'back after down'})"
            self._fresh(now)
        if self.state == "hung":
            if moved:
                self._fresh(now)
                return self._step(now, note="recovered: progress again after the hang")
            return self._hung_step(t, now)
        verdict, dismissed = self._judge(obs, now)
        if verdict is not None:
            if verdict.since is None:
                verdict = replace(verdict, since=self.last_progress_at)
            self.state = "hung"
            return Step(
                "hung", verdict=verdict, abort_canary=True, note=dismissed, seconds_since_progress=self._since(now)
            )
        return self._step(now, note=note or dismissed, canary_open=_canary_open(t))

    # ------------------------------------------------------------------ parts

    def _down(self, now: float) -> Step:
        note = None if self.state == "down" else f"server down (connection refused; was {self.state})"
        pending, self._pending_dead = self._pending_dead, None
        if pending is not None and not self._saw_5xx:
            note, pending = "EngineDeadError line followed by a stop, with no 5xx: a shutdown, not a finding", None
        self.state = "down"
        self._counters = None
        return Step("down", verdict=pending, abort_canary=True, note=note, seconds_since_progress=self._since(now))

    def _unanswered(self, obs: Observation, now: float) -> HangVerdict | None:
        if obs.unanswered is None or obs.answered_at is None:
            return None
        silent = now - obs.answered_at
        limit = self.silence_limit()
        if silent <= limit:
            return None
        return HangVerdict(
            detector="unanswered",
            kind="hang",
            at=now,
            since=obs.answered_at,
            message=(
                f"the server takes connections but answered no request in full for {silent:.1f} s "
                f"(threshold {limit:.1f} s); latest: {obs.unanswered}"
            ),
            details={"silent_s": silent, "threshold_s": limit, "latest": obs.unanswered},
        )

    def silence_limit(self) -> float:
        if self.config.unanswered_after_s is not None:
            return self.config.unanswered_after_s
        learned = [t.value() for d in self.detectors if isinstance(t := getattr(d, "threshold", None), StallThreshold)]
        return max(learned, default=self.config.unanswered_default_s)

    def _fresh(self, now: float) -> None:
        self.detectors = list(self.make_detectors())
        self.last_progress_at = now
        self._pending_dead = None
        self._saw_5xx = False
        self.state = "idle"

    def _progress(self, t: Tick) -> bool:
        moved = False
        if t.metrics is not None:
            m = t.metrics
            counters = (m.generation_tokens, m.prompt_tokens, m.steps)
            if self._counters is not None and counters != self._counters:
                moved = True
                self.last_progress_at = max(self.last_progress_at or 0.0, m.at)
            self._counters = counters
        s = t.stream
        if s is not None and s.last_token_at is not None and s.last_token_at != self._canary_token_at:
            self._canary_token_at = s.last_token_at
            moved = True
            self.last_progress_at = max(self.last_progress_at or 0.0, s.last_token_at)
        return moved

    def _judge(self, obs: Observation, now: float) -> tuple[HangVerdict | None, str | None]:
        t = obs.tick
        fired = [v for v in (d.observe(t) for d in self.detectors) if v is not None]
        if self._pending_dead is not None:
            pending = self._pending_dead
            failing = t.stream is not None and t.stream.consecutive_failures > 0
            if self._saw_5xx or failing or any(FATAL_LINE.search(line) for line in t.log_lines):
                self._pending_dead = None
                return pending, None
            if now - pending.at > self.config.confirm_dead_s:
                self._pending_dead = None
                return None, "EngineDeadError line not confirmed (no 5xx, no fatal error): dismissed"
        for v in fired:
            if (
                v.detector == "logs"
                and v.hint == "engine_dead"
                and not any(FATAL_LINE.search(line) for line in t.log_lines)
            ):
                if self._saw_5xx:
                    return v, None
                self._pending_dead = self._pending_dead or v
                continue
            others = [f"{o.detector}: {o.message}" for o in fired if o is not v]
            return (replace(v, details={**v.details, "also": others}) if others else v), None
        return None, None

    def _hung_step(self, t: Tick, now: float) -> Step:
        # keep asking: a canary that gets a token (or counters that move) ends the episode
        due = self._canary_due(now, canary_open=False)
        return Step(
            "hung", send_canary=due, abort_canary=due and _canary_open(t), seconds_since_progress=self._since(now)
        )

    def _step(self, now: float, note: str | None = None, canary_open: bool = False) -> Step:
        stale = self.last_sample_at is None or now - self.last_sample_at > self.config.stale_after_s
        self.state = "stale" if stale else "busy" if self._gauges_busy else "idle"
        send = self._canary_due(now, canary_open)
        return Step(self.state, send_canary=send, note=note, seconds_since_progress=self._since(now))

    def _canary_due(self, now: float, canary_open: bool) -> bool:
        every = self.config.canary_every_s
        if every <= 0 or canary_open:
            return False
        proof = max(self.last_progress_at or 0.0, self.last_canary_at or 0.0)
        if now - proof < every:
            return False
        self.last_canary_at = now
        return True

    def _since(self, now: float) -> float | None:
        return None if self.last_progress_at is None else max(0.0, now - self.last_progress_at)


def _canary_open(t: Tick) -> bool:
    return t.stream is not None and t.stream.open_streams > 0
