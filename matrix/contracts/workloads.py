"""Workload kinds and their parameters: the contract between a matrix file's `workloads:` and the
load driver in `jobs/`. `WORKLOAD_KINDS` is a plain dict; a test or plugin may add a kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str
    params: Mapping[str, Any]  # every parameter of the kind, defaults filled in



# param -> (type, default). "range" is a [low, high] pair of non-negative integers.
COMMON_PARAMS: dict[str, tuple[str, Any]] = {
    "loop": ("choice:closed,open", "closed"),   # closed: fixed concurrency; open: Poisson arrivals
    "concurrency": ("int", 8),                   # closed loop: requests in flight
    "rate": ("float", 4.0),                      # open loop: mean arrivals per second
    "input_len": ("range", [64, 512]),           # prompt tokens, drawn uniformly
    "output_len": ("range", [32, 256]),          # max completion tokens, drawn uniformly
    "api": ("choice:completions,chat", "completions"),
    "stream": ("bool", True),
    "max_requests": ("int", 100_000),            # hard bound on requests sent
    "request_timeout_s": ("float", 600.0),       # hard bound on one request
    "seed": ("int", 0),
}

WORKLOAD_KINDS: dict[str, dict[str, tuple[str, Any]]] = {
    # uniformly random lengths so completions stagger (seed 003: lock-step load never hangs)
    "random": {},
    # multi-turn chat sharing a system prompt, each turn resending the history (seeds 000, 001)
    "chat": {"turns": ("int", 4), "shared_prefix_len": ("int", 512), "sessions": ("int", 64)},
    # concurrency ramps from `concurrency` to `peak`, with spikes (seed 001)
    "ramp": {"peak": ("int", 64), "ramp_s": ("float", 120.0), "spike_every_s": ("float", 60.0),
             "spike_len_s": ("float", 10.0)},
    # idle gaps, then trickles of 0-`max_burst` requests (seed 004)
    "trickle": {"idle_s": ("float", 30.0), "max_burst": ("int", 2), "burst_every_s": ("float", 5.0)},
}


def params_of(kind: str) -> dict[str, tuple[str, Any]]:
    """Every parameter a workload of this kind accepts, with its type and default."""
    return {**COMMON_PARAMS, **WORKLOAD_KINDS[kind]}


def check_param(kind_type: str, value: Any) -> str | None:
    """Why `value` does not fit a parameter type, or None."""
    if kind_type == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"expected a non-negative integer, got {value!r}"
    if kind_type == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        return None if ok else f"expected a non-negative number, got {value!r}"
    if kind_type == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if kind_type == "range":
        ok = (isinstance(value, list) and len(value) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
              and value[0] <= value[1])
        return None if ok else f"expected [low, high] with 0 <= low <= high, got {value!r}"
    if kind_type.startswith("choice:"):
        choices = kind_type.split(":", 1)[1].split(",")
        return None if value in choices else f"{value!r} is not one of {', '.join(choices)}"
    return f"unknown parameter type {kind_type}"
