"""The shapes of load a workload asks for, as pure seeded functions (no sockets, no clocks).

`matrix/contracts/workloads.py` names the kinds and their parameters; this module turns a kind's parameters
into (a) how many requests should be in flight at time t (closed loop), or the gaps between
arrivals (open loop, Poisson, or trickle bursts), and (b) the requests themselves: random prompts
with uniformly drawn lengths (range ratio 0, so completions stagger: seed 003), or multi-turn chat
sessions sharing a system prompt and resending their history (seeds 000, 001).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# A fixed word list: one word is about one token for vLLM's tokenizers and exactly one for the sim.
WORDS = (
    "the of and to in is was for on are with as at be by this from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three"
).split()


@dataclass(frozen=True)
class RequestSpec:
    api: str  # "completions" | "chat"
    max_tokens: int
    input_len: int  # prompt length in words (about tokens)
    prompt: str = ""
    messages: tuple[Mapping[str, str], ...] = ()
    session: int | None = None
    turn: int = 0

    def body(self, model: str, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": stream,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.api == "chat":
            body["messages"] = [dict(m) for m in self.messages]
        else:
            body["prompt"] = self.prompt
        return body


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


def draw(rng: random.Random, bounds: Any) -> int:
    low, high = bounds
    return rng.randint(int(low), int(high))


class RequestSource:
    """Seeded stream of requests for one workload; chat sessions keep their history."""

    def __init__(self, kind: str, params: Mapping[str, Any], seed: int) -> None:
        self.kind, self.params = kind, params
        self.rng = random.Random(f"{seed}:{params.get('seed', 0)}:{kind}")
        self.api = "chat" if kind == "chat" else str(params.get("api", "completions"))
        self._system = words(random.Random(f"prefix:{seed}"), int(params.get("shared_prefix_len", 0) or 0))
        self._sessions: dict[int, list[dict[str, str]]] = {}
        self._next_session = 0

    def next(self) -> RequestSpec:
        input_len = draw(self.rng, self.params.get("input_len", [64, 512]))
        max_tokens = max(1, draw(self.rng, self.params.get("output_len", [32, 256])))
        if self.kind != "chat":
            if self.api == "chat":
                return RequestSpec(
                    "chat", max_tokens, input_len, messages=({"role": "user", "content": words(self.rng, input_len)},)
                )
            return RequestSpec("completions", max_tokens, input_len, prompt=words(self.rng, input_len))
        return self._chat_turn(input_len, max_tokens)

    def _chat_turn(self, input_len: int, max_tokens: int) -> RequestSpec:
        sessions = max(1, int(self.params.get("sessions", 64)))
        turns = max(1, int(self.params.get("turns", 4)))
        session = self.rng.randrange(sessions)
        history = self._sessions.get(session)
        if history is None or len(history) // 2 >= turns:
            history = [{"role": "system", "content": self._system}] if self._system else []
        user = {"role": "user", "content": words(self.rng, input_len)}
        messages = (*history, user)
        self._sessions[session] = [*history, user]
        total = sum(len(m["content"].split()) for m in messages)
        return RequestSpec(
            "chat",
            max_tokens,
            total,
            messages=tuple(messages),
            session=session,
            turn=sum(1 for m in messages if m["role"] == "user"),
        )

    def answered(self, spec: RequestSpec, text: str) -> None:
        """Append the assistant's reply so the session's next turn resends the whole history."""
        if spec.session is None:
            return
        history = self._sessions.get(spec.session)
        if history is not None and history and history[-1] == spec.messages[-1]:
            history.append({"role": "assistant", "content": text or "ok"})


# ---------------------------------------------------------------- when to send


def target_concurrency(kind: str, params: Mapping[str, Any], t: float) -> int:
    """Closed loop: requests that should be in flight `t` seconds into the soak."""
    base = int(params.get("concurrency", 8))
    if kind != "ramp":
        return base
    peak = max(base, int(params.get("peak", base)))
    ramp_s = float(params.get("ramp_s", 0.0))
    every, length = float(params.get("spike_every_s", 0.0)), float(params.get("spike_len_s", 0.0))
    if every > 0 and length > 0 and t >= every and (t % every) < length:
        return peak  # a spike: straight to the peak, as an autoscaler's burst does (seed 001)
    frac = 1.0 if ramp_s <= 0 else min(1.0, t / ramp_s)
    return round(base + (peak - base) * frac)


def poisson_gaps(rate: float, rng: random.Random) -> Iterator[float]:
    """Open loop: exponential gaps between arrivals at `rate` per second."""
    while True:
        yield rng.expovariate(rate) if rate > 0 else math.inf


@dataclass(frozen=True)
class Burst:
    at: float  # seconds into the soak
    count: int  # requests sent together (0 is a burst that sends nothing)


def trickle_bursts(params: Mapping[str, Any], rng: random.Random) -> Iterator[Burst]:
    """Seed 004's shape: an idle gap of `idle_s`, then for as long again a burst of 0..`max_burst`
    requests every `burst_every_s`; repeat."""
    idle = float(params.get("idle_s", 30.0))
    every = max(0.05, float(params.get("burst_every_s", 5.0)))
    max_burst = int(params.get("max_burst", 2))
    t = 0.0
    while True:
        t += idle
        end = t + max(idle, every)
        while t < end:
            yield Burst(t, rng.randint(0, max_burst))
            t += every


def is_open_loop(kind: str, params: Mapping[str, Any]) -> bool:
    return kind == "trickle" or params.get("loop", "closed") == "open"


@dataclass
class Arrivals:
    """Open-loop arrival times (seconds into the soak), one request each."""

    kind: str
    params: Mapping[str, Any]
    seed: int
    _iter: Iterator[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = random.Random(f"arrivals:{self.seed}:{self.params.get('seed', 0)}")
        self._iter = self._times(rng)

    def _times(self, rng: random.Random) -> Iterator[float]:
        if self.kind == "trickle":
            for burst in trickle_bursts(self.params, rng):
                for _ in range(burst.count):
                    yield burst.at
            return
        rate = float(self.params.get("rate", 4.0))
        t = 0.0
        for gap in poisson_gaps(rate, rng):
            t += gap
            if self.kind == "ramp":
                base = max(1, int(self.params.get("concurrency", 8)))
                # thin the arrivals by the ramp's current level relative to its peak
                peak = max(base, int(self.params.get("peak", base)))
                if rng.random() > target_concurrency(self.kind, self.params, t) / peak:
                    continue
            yield t

    def __iter__(self) -> Iterator[float]:
        return self._iter
