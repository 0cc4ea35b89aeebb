"""Passive variants of the soak's detectors, for a server under other people's traffic.

The soak knows its own requests (their prompts, their streams); a watch sees only /metrics, the log
and its own canary. Two detectors change, both registered in the soak's registry
(`jobs/detect/protocol.py`) and sharing one learned `StallThreshold`, so a long legitimate step seen
by either side raises the allowance for both:

- `passive_progress`: the soak's progress detector, except that "requests waiting, none running" is
  not load: legitimate queueing (grammar compilation, remote KV, LoRA loads) reads that way, and so
  does a wedge whose gauges went stale. The loop answers that case with a canary instead.
- `canary`: the stream detector fed by the canary's stream only. The canary waits behind whatever
  step the engine is in, so any movement of the server's progress counters counts as progress too:
  a canary queued behind a long prefill chunk is not a hang while the chunks keep landing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from soakmatrix.jobs.detect.progress import ProgressDetector
from soakmatrix.jobs.detect.protocol import Detector, HangVerdict, StallThreshold, Tick, build_detectors, register

# The passive allowance: steps of a 100k-token chunked prefill grow to ~15 s on the simulated H200,
# so the learned base (2 x the longest gap) may grow to 30 s; unexplained silences start at 6 s.
PASSIVE_THRESHOLD = {"floor_s": 6.0, "factor": 2.0, "ceiling_s": 30.0, "learn_prefill": False}

WATCH_DETECTORS = ("passive_progress", "canary", "logs", "errors")


class PassiveProgressDetector(ProgressDetector):
    name = "passive_progress"

    def __init__(self, threshold: StallThreshold | None = None, **threshold_options: Any) -> None:
        super().__init__(**threshold_options)
        if threshold is not None:
            self.threshold = threshold

    def observe(self, obs: Tick) -> HangVerdict | None:
        m = obs.metrics
        if m is not None and not (m.running or 0) > 0 and (m.waiting or 0) > 0:
            obs = replace(obs, metrics=replace(m, waiting=0.0))
        return super().observe(obs)


class CanaryStreamDetector:
    name = "canary"

    def __init__(self, threshold: StallThreshold | None = None, **threshold_options: Any) -> None:
        self.threshold = threshold if threshold is not None else StallThreshold(**threshold_options)
        self._counters: tuple | None = None
        self._server_progress_at: float | None = None
        self._open_since: float | None = None

    def observe(self, obs: Tick) -> HangVerdict | None:
        m = obs.metrics
        if m is not None:
            counters = (m.generation_tokens, m.prompt_tokens, m.steps)
            if self._counters is not None and counters != self._counters:
                self._server_progress_at = m.at
            self._counters = counters
        s = obs.stream
        if s is None or s.open_streams <= 0:
            self._open_since = None
            return None
        if self._open_since is None:
            self._open_since = s.oldest_waiting_first_token_since or s.at
        # a canary that has not had its first token is timed from its own start, not its predecessor's
        since = max(
            self._open_since,
            s.oldest_waiting_first_token_since or 0.0,
            s.last_token_at or 0.0,
            self._server_progress_at or 0.0,
        )
        silent = s.at - since
        limit = self.threshold.value(s.waiting_first_token_prompt_len)
        if silent <= limit:
            return None
        got = f"after {s.tokens} tokens" if s.tokens else "before its first token"
        return HangVerdict(
            detector=self.name,
            kind="hang",
            at=obs.now,
            since=since,
            message=(
                f"canary request silent {got} for {silent:.1f} s and the server's progress counters "
                f"did not move (threshold {limit:.1f} s)"
            ),
            details={"silent_s": silent, "threshold_s": limit, "canary_tokens": s.tokens},
        )


register("passive_progress")(PassiveProgressDetector)
register("canary")(CanaryStreamDetector)


def build_watch_detectors(
    names: Sequence[str] = WATCH_DETECTORS,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    threshold: Mapping[str, Any] | None = None,
) -> list[Detector]:
    """Fresh detectors for one watch episode; the two stall detectors share one learned threshold.
    The errors detector counts the canary's failures: three in a row is a dead engine."""
    shared = StallThreshold(**{**PASSIVE_THRESHOLD, **dict(threshold or {})})
    opts: dict[str, dict[str, Any]] = {"errors": {"max_in_a_row": 3}}
    for name in ("passive_progress", "canary"):
        opts[name] = {"threshold": shared}
    for name, extra in (options or {}).items():
        opts[name] = {**opts.get(name, {}), **dict(extra)}
    return build_detectors(names, opts)
