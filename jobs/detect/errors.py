"""Errors detector: the server still answers, but every request fails.

An engine core that died behind a living API server turns every request into a 500 (vLLM's
EngineDeadError) or, once the API server is gone too, into refused connections. When the log says
nothing recognisable and the process is not ours to watch, this is what tells a dead engine from a
pass: `max_in_a_row` requests failing in a row with server-side errors. Our own cancellations and
request timeouts (a hang's symptom, the stall detectors' business) do not count.
"""

from __future__ import annotations

from .protocol import HangVerdict, Tick, register


class ErrorsDetector:
    name = "errors"

    def __init__(self, max_in_a_row: int = 20) -> None:
        self.max_in_a_row = max_in_a_row

    def observe(self, obs: Tick) -> HangVerdict | None:
        s = obs.stream
        if s is None or s.consecutive_failures < self.max_in_a_row or s.last_error == "timeout":
            return None
        return HangVerdict(
            detector=self.name,
            kind="crash",
            at=obs.now,
            since=s.last_token_at,
            message=f"{s.consecutive_failures} requests in a row failed (last: {s.last_error})",
            hint="engine_dead",
            details={"consecutive_failures": s.consecutive_failures, "last_error": s.last_error},
        )


register("errors")(ErrorsDetector)
