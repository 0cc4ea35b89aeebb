"""The detector interface of the hang watchdog: what a detector sees, what it says, and the registry.

A detector is a small pure state machine. Every tick the watchdog hands it one `Tick` (a
metrics sample, the client's stream state, new log lines, the process's exit code, the clock) and
the detector answers with a `HangVerdict` or None. Side effects (HTTP scrapes, reading the log, polling
the process, reading the clock) stay in `watchdog.py`, so detectors are tested on recorded series.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class MetricsSample:
    """One /metrics scrape reduced to the numbers the detectors use."""

    at: float  # epoch seconds when the scrape answered
    generation_tokens: float | None = None  # vllm:generation_tokens_total
    prompt_tokens: float | None = None  # vllm:prompt_tokens_total
    running: float | None = None  # vllm:num_requests_running
    waiting: float | None = None  # vllm:num_requests_waiting
    steps: float | None = None  # vllm:iteration_tokens_total_count (steps with tokens)
    elapsed_s: float = 0.0  # how long the scrape took


@dataclass(frozen=True)
class StreamState:
    """The load driver's view of its open streams (client side, independent of the server's metrics)."""

    at: float
    open_streams: int = 0
    last_token_at: float | None = None  # latest token received on any stream
    oldest_waiting_first_token_since: float | None = None  # earliest start of a stream with no token yet
    waiting_first_token_prompt_len: int = 0  # longest prompt among streams still waiting for a token
    tokens: int = 0  # tokens received so far (all streams)
    consecutive_failures: int = 0  # requests failed in a row (server errors, refused connections)
    last_error: str | None = None


@dataclass(frozen=True)
class Tick:
    now: float
    metrics: MetricsSample | None = None  # None: no scrape this tick, or it failed / timed out
    stream: StreamState | None = None
    log_lines: Sequence[str] = ()  # lines written to the server log since the last tick
    exit_code: int | None = None  # the server process's exit code once it has exited
    scrape_error: str | None = None


@dataclass(frozen=True)
class HangVerdict:
    detector: str  # the detector that fired
    kind: str  # "hang" | "crash"
    at: float  # epoch seconds when it fired
    since: float | None  # epoch seconds of the last progress seen (hang began by then)
    message: str
    hint: str | None = None  # a signature the detector's evidence points at
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def detected_after_s(self) -> float | None:
        return None if self.since is None else max(0.0, self.at - self.since)


class Detector(Protocol):
    name: str

    def observe(self, obs: Tick) -> HangVerdict | None:
        """Take one tick's observation; return a verdict once this detector is sure."""
        ...


# name -> factory (keyword options -> Detector). Plain dict: tests and users add their own.
DETECTORS: dict[str, Callable[..., Detector]] = {}


def register(name: str) -> Callable[[Callable[..., Detector]], Callable[..., Detector]]:
    def add(factory: Callable[..., Detector]) -> Callable[..., Detector]:
        DETECTORS[name] = factory
        return factory

    return add


DEFAULT_DETECTORS = ("progress", "stream", "logs", "exit", "errors")


def build_detectors(
    names: Sequence[str] = DEFAULT_DETECTORS, options: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Detector]:
    """Fresh detectors by name (each detector is stateful: one set per cell)."""
    load_builtin()
    options = options or {}
    missing = [n for n in names if n not in DETECTORS]
    if missing:
        raise KeyError(f"unknown detector(s) {', '.join(missing)}; known: {', '.join(DETECTORS)}")
    return [DETECTORS[n](**dict(options.get(n, {}))) for n in names]


def load_builtin() -> None:
    """Import the built-in detector modules so they register themselves."""
    # importing a module registers its detectors: the names themselves go unused
    from . import errors as detect_errors  # noqa: F401
    from . import exit as detect_exit  # noqa: F401
    from . import logs as detect_logs  # noqa: F401
    from . import progress as detect_progress  # noqa: F401
    from . import stream as detect_stream  # noqa: F401


class StallThreshold:
    """How long "no progress" may last before it is a hang, learned from what was seen so far.

    Two parts. The base: `factor` times the longest recent silence that nothing explains (slow
    scrapes, slow decode steps), never below `floor_s` and never above `ceiling_s` (so detection
    keeps its latency target). The prefill allowance: a request still waiting for its first token
    may be in a prefill, whose step grows with its prompt, so `prefill_factor` x seconds per prompt
    token x the longest waiting prompt is added. Seconds per prompt token start at the prior
    `prefill_s_per_token` and rise to the slowest prefill observed (`learn_prefill`): a long prefill
    is not a hang.
    """

    def __init__(
        self,
        floor_s: float = 6.0,
        factor: float = 2.0,
        ceiling_s: float = 15.0,
        prefill_s_per_token: float = 0.0005,
        prefill_factor: float = 1.25,
        learn_prefill: bool = True,
        window: int = 512,
    ) -> None:
        from collections import deque

        self.floor_s, self.factor, self.ceiling_s = floor_s, factor, ceiling_s
        self.prefill_s_per_token, self.prefill_factor = prefill_s_per_token, prefill_factor
        self.learn_prefill = learn_prefill
        self.gaps: deque[float] = deque(maxlen=window)
        self.rates: deque[float] = deque(maxlen=window)

    def learn(self, gap_s: float, waiting_prompt_tokens: int = 0) -> None:
        """A silence of `gap_s` just ended; `waiting_prompt_tokens`: the longest prompt that was
        waiting for its first token meanwhile (0: none, the silence is unexplained)."""
        if gap_s <= 0:
            return
        if waiting_prompt_tokens > 0:
            if self.learn_prefill and gap_s > self.floor_s / 2:
                self.rates.append(gap_s / waiting_prompt_tokens)
            return
        self.gaps.append(gap_s)

    @property
    def base(self) -> float:
        longest = max(self.gaps, default=0.0)
        return min(self.ceiling_s, max(self.floor_s, self.factor * longest))

    @property
    def seconds_per_prompt_token(self) -> float:
        return max(self.prefill_s_per_token, max(self.rates, default=0.0))

    def value(self, waiting_prompt_tokens: int = 0) -> float:
        return self.base + self.prefill_factor * self.seconds_per_prompt_token * max(0, waiting_prompt_tokens)
