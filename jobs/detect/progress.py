"""Progress detector: `vllm:generation_tokens_total` flat while `vllm:num_requests_running > 0`.

The server-side signal of every seed: a hung engine keeps /health at 200 but its token counters
freeze. Any of the progress counters moving (generated tokens, prompt tokens, engine steps) counts
as progress, so a long prefill that moves prompt tokens is not a stall; the allowed silence adapts to
the longest gaps seen between progress (`StallThreshold`). A failed or slow scrape carries no
information: it neither proves progress nor extends a stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .protocol import HangVerdict, MetricsSample, StallThreshold, Tick, register

METRIC_FIELDS = {
    # sample name (as the parser yields it) -> MetricsSample field
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:iteration_tokens_total_count": "steps",
}


def parse_metrics(text: str, at: float, elapsed_s: float = 0.0) -> MetricsSample:
    """Reduce a Prometheus text exposition to a `MetricsSample`; series of all engines are summed."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = METRIC_FIELDS.get(sample.name)
            if name is not None:
                values[name] = values.get(name, 0.0) + float(sample.value)
    return MetricsSample(at=at, elapsed_s=elapsed_s, **values)


@dataclass
class _Last:
    counters: tuple[float | None, ...]
    at: float


class ProgressDetector:
    name = "progress"

    def __init__(self, **threshold_options: Any) -> None:  # StallThreshold's
        # Scrapes are too coarse to tell a prefill from a slow scrape: every gap between progress
        # counts towards the base, and the allowance per prompt token stays at its prior.
        threshold_options.setdefault("learn_prefill", False)
        self.threshold = StallThreshold(**threshold_options)
        self._last: _Last | None = None
        self._progress_at: float | None = None  # first scrape that saw the latest counter values
        self._busy_since: float | None = None  # first scrape of the current busy period
        self._peak_running = 0.0

    def observe(self, obs: Tick) -> HangVerdict | None:
        m = obs.metrics
        if m is None or m.generation_tokens is None:
            return None
        # the client's view, where there is one: a request still waiting for its first token may be
        # in a long prefill, which moves no counter until it ends
        waiting_prompt = obs.stream.waiting_first_token_prompt_len if obs.stream is not None else 0
        counters = (m.generation_tokens, m.prompt_tokens, m.steps)
        busy = (m.running or 0) > 0 or (m.waiting or 0) > 0
        last = self._last
        self._last = _Last(counters, m.at)
        if last is None:
            self._progress_at = m.at
            self._busy_since = m.at if busy else None
            return None
        moved = any(c is not None and p is not None and c != p for c, p in zip(counters, last.counters, strict=True))
        if moved:
            if self._busy_since is not None and self._progress_at is not None:
                self.threshold.learn(m.at - max(self._progress_at, self._busy_since))
            self._progress_at = m.at
            self._busy_since = m.at if busy else None
            return None
        if not busy:
            self._busy_since = None
            return None
        if self._busy_since is None:
            self._busy_since = m.at
        self._peak_running = max(self._peak_running, m.running or 0)
        since = max(self._progress_at or m.at, self._busy_since)
        stalled = m.at - since
        limit = self.threshold.value(waiting_prompt)
        if stalled <= limit:
            return None
        return HangVerdict(
            detector=self.name,
            kind="hang",
            at=obs.now,
            since=since,
            message=(
                f"generation_tokens_total flat at {m.generation_tokens:.0f} for {stalled:.1f} s "
                f"with {m.running or 0:.0f} requests running, {m.waiting or 0:.0f} waiting "
                f"(threshold {limit:.1f} s)"
            ),
            details={
                "tokens": m.generation_tokens,
                "running": m.running,
                "waiting": m.waiting,
                "stalled_s": stalled,
                "threshold_s": limit,
            },
        )


register("progress")(ProgressDetector)
