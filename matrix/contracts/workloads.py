"""Workload kinds and their parameters: the contract between a matrix file's `workloads:` and the
load driver in `jobs/`. `WORKLOAD_KINDS` is a plain dict; a test or plugin may add a kind."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str
    params: Mapping[str, Any]  # every parameter of the kind, defaults filled in


# param -> (type, default). "count" is an integer >= 1, "int" one >= 0, "positive" a number > 0,
# "float" one >= 0, "range" a [low, high] pair of integers with 1 <= low <= high: a zero where it
# means "nothing happens" (no request in flight, no token asked for) is an error, not a quiet no-op.
COMMON_PARAMS: dict[str, tuple[str, Any]] = {
    "loop": ("choice:closed,open", "closed"),  # closed: fixed concurrency; open: Poisson arrivals
    "concurrency": ("count", 8),  # closed loop: requests in flight
    "rate": ("positive", 4.0),  # open loop: mean arrivals per second
    "input_len": ("range", [64, 512]),  # prompt tokens, drawn uniformly
    "output_len": ("range", [32, 256]),  # max completion tokens, drawn uniformly
    "api": ("choice:completions,chat", "completions"),
    "stream": ("bool", True),
    "max_requests": ("count", 100_000),  # hard bound on requests sent
    "request_timeout_s": ("positive", 600.0),  # hard bound on one request
    "seed": ("int", 0),
}

WORKLOAD_KINDS: dict[str, dict[str, tuple[str, Any]]] = {
    # uniformly random lengths so completions stagger (seed 003: lock-step load never hangs)
    "random": {},
    # multi-turn chat sharing a system prompt, each turn resending the history (seeds 000, 001)
    "chat": {"turns": ("count", 4), "shared_prefix_len": ("int", 512), "sessions": ("count", 64)},
    # concurrency ramps from `concurrency` to `peak`, with spikes (seed 001)
    "ramp": {
        "peak": ("count", 64),
        "ramp_s": ("float", 120.0),
        "spike_every_s": ("positive", 60.0),
        "spike_len_s": ("float", 10.0),
    },
    # idle gaps, then trickles of 0-`max_burst` requests (seed 004)
    "trickle": {"idle_s": ("float", 30.0), "max_burst": ("count", 2), "burst_every_s": ("positive", 5.0)},
}


def params_of(kind: str) -> dict[str, tuple[str, Any]]:
    """Every parameter a workload of this kind accepts, with its type and default."""
    return {**COMMON_PARAMS, **WORKLOAD_KINDS[kind]}


def check_param(kind_type: str, value: Any) -> str | None:
    """Why `value` does not fit a parameter type, or None."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_number = (is_int or isinstance(value, float)) and math.isfinite(value)
    if kind_type == "count":
        return None if is_int and value >= 1 else f"expected an integer >= 1, got {value!r}"
    if kind_type == "int":
        return None if is_int and value >= 0 else f"expected a non-negative integer, got {value!r}"
    if kind_type == "positive":
        return None if is_number and value > 0 else f"expected a number above 0, got {value!r}"
    if kind_type == "float":
        return None if is_number and value >= 0 else f"expected a non-negative number, got {value!r}"
    if kind_type == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if kind_type == "range":
        ok = (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
            and value[0] <= value[1]
        )
        return None if ok else f"expected [low, high] with 1 <= low <= high, got {value!r}"
    if kind_type.startswith("choice:"):
        choices = kind_type.split(":", 1)[1].split(",")
        return None if value in choices else f"{value!r} is not one of {', '.join(choices)}"
    return f"unknown parameter type {kind_type}"
