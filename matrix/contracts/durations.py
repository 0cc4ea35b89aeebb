"""Durations as people write them in matrix files and read them in reports: `90s`, `10m`, `1h30m`, `2h`.

One parser and one formatter for the whole product, so a soak length reads the same in a matrix
file, a plan, a bisection report, JUnit and the dashboard.
"""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?"
    r"\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$"
)


def parse_duration(value: Any) -> float:
    """Seconds from `90`, `90s`, `10m`, `2h`, `1h30m`, `1d`. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value}")
        return float(value)
    if isinstance(value, str):
        if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", value):
            return float(value)
        m = _DURATION.match(value)
        if m and any(m.groups()):
            d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
            return d * 86400 + h * 3600 + mi * 60 + s
    raise ValueError(f"expected a duration like 90s, 10m, 2h or 1h30m, got {value!r}")


def format_duration(seconds: float) -> str:
    """`2h`, `38m`, `1h30m`, `45s`: the shortest exact-enough spelling."""
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.2f}s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f}m" if abs(minutes - round(minutes)) < 0.05 else f"{minutes:.1f}m"
    hours, rem = divmod(round(minutes), 60)
    return f"{hours}h{rem:02d}m" if rem else f"{hours}h"
