"""Client-side stall detector: no token on any open stream for longer than the engine's steps allow.

Independent of the server's own metrics (which a hung API server may stop answering, and whose
`num_requests_running` goes stale in a hang). The allowed silence is learned from the gaps between
tokens the client has seen, so a long prefill that held every stream (and showed up as one long
gap) raises the threshold instead of raising an alarm.
"""

from __future__ import annotations

from typing import Any

from .protocol import HangVerdict, StallThreshold, Tick, register


class StreamDetector:
    name = "stream"

    def __init__(self, **threshold_options: Any) -> None:  # StallThreshold's
        self.threshold = StallThreshold(**threshold_options)
        self._last_token_at: float | None = None
        self._open_since: float | None = None  # first tick of the current period with open streams
        self._waiting_prompt = 0  # longest prompt waiting for a first token this silence

    def observe(self, obs: Tick) -> HangVerdict | None:
        s = obs.stream
        if s is None:
            return None
        if s.open_streams <= 0:
            self._open_since = None
            self._last_token_at = s.last_token_at
            self._waiting_prompt = 0
            return None
        if self._open_since is None:
            self._open_since = s.at
        if s.last_token_at is not None and s.last_token_at != self._last_token_at:
            if self._last_token_at is not None:
                # the silence just ended: a legitimate gap (measured while streams were open)
                self.threshold.learn(s.last_token_at - max(self._last_token_at, self._open_since), self._waiting_prompt)
            self._last_token_at = s.last_token_at
            self._waiting_prompt = s.waiting_first_token_prompt_len
            return None
        self._waiting_prompt = max(self._waiting_prompt, s.waiting_first_token_prompt_len)
        since = max(self._last_token_at or self._open_since, self._open_since)
        silent = s.at - since
        limit = self.threshold.value(s.waiting_first_token_prompt_len)
        if silent <= limit:
            return None
        return HangVerdict(
            detector=self.name,
            kind="hang",
            at=obs.now,
            since=since,
            message=(f"no token on any of {s.open_streams} open streams for {silent:.1f} s (threshold {limit:.1f} s)"),
            details={"open_streams": s.open_streams, "silent_s": silent, "threshold_s": limit, "tokens": s.tokens},
        )


register("stream")(StreamDetector)
