"""argparse types for the CLI's numbers and durations: every value is checked where it is read, so a
`--budget nan`, `--max-probes 0` or `--mttf-cap soon` is exit 2 naming the option (argparse's
`argument --x: ...` message), never a run that ends in a false "no hang" or a traceback.
"""

from __future__ import annotations

import argparse
import math

from .contracts.durations import parse_duration


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_number(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def count(text: str) -> int:
    """An integer >= 1 (probes, hangs, copies in parallel)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def open_unit_interval(text: str) -> float:
    """A probability strictly between 0 and 1 (a confidence)."""
    value = _number(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1, got {text}")
    return value


def half_open_unit_interval(text: str) -> float:
    """A probability in [0, 1) (a prior that may be switched off with 0)."""
    value = _number(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def positive_duration(text: str) -> float:
    """Seconds from `90s`, `10m`, `2h`, `1h30m`; must be above 0."""
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a duration above 0, got {text!r}")
    return value


def seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None

