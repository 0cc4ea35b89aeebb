"""argparse types for the CLI's numbers, durations, addresses and free text: every value is checked
where it is read, so a `--budget nan`, `--max-probes 0`, `--metrics-port 70000` or a duration of a
thousand digits is exit 2 naming the option (argparse's `argument --x: ...` message), never a run
that ends in a false "no hang", a hang of its own or a traceback.

Each type carries `kind` (what it checks: count, port, pid, duration, ...) and `range_text` (the
range its --help must state); tests/test_cli_options.py walks every parser by them, so an option
whose type has neither is flagged. Paths have their own types in matrix/paths.py.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from .contracts.durations import parse_duration

MAX_NUMBER_CHARS = 64  # no number or duration is longer; the cap comes before any parsing
MAX_TEXT_CHARS = 4096
DAY = 86400.0
SEED_MAX = 2**63 - 1
PID_MAX_FILE = "/proc/sys/kernel/pid_max"
PID_MAX_DEFAULT = 4_194_304  # the kernel's ceiling on 64-bit, where /proc cannot tell


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ArgType(Protocol[T_co]):
    """An argparse type marked by `typed`: callable on the option's text, and saying what it checks."""

    kind: str
    range_text: str
    __name__: str

    def __call__(self, text: str, /) -> T_co: ...


def typed(fn: Callable[[str], T], kind: str, range_text: str = "") -> ArgType[T]:
    """`fn` marked with what it checks, for the test that walks every parser (and --help's range)."""
    marked = cast("ArgType[T]", fn)
    marked.kind = kind
    marked.range_text = range_text
    marked.__name__ = kind
    return marked


def _short(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_NUMBER_CHARS} characters, got {len(text)}")
    return text


def _number(text: str) -> float:
    try:
        value = float(_short(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _integer(text: str) -> int:
    try:
        return int(_short(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def integer(low: int, high: int, kind: str = "count") -> ArgType[int]:
    """An integer in [low, high]."""

    def parse(text: str) -> int:
        value = _integer(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {_num(low)} to {_num(high)}, got {text}")
        return value

    return typed(parse, kind, f"{_num(low)} to {_num(high)}")


def real(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False, kind: str = "number"
) -> ArgType[float]:
    """A finite number between low and high (each end included unless open)."""

    def parse(text: str) -> float:
        value = _number(text)
        if (value < low or (low_open and value == low)) or (value > high or (high_open and value == high)):
            raise argparse.ArgumentTypeError(f"must be {_interval(low, high, low_open, high_open)}, got {text}")
        return value

    return typed(parse, kind, _interval(low, high, low_open, high_open))


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return f"{'above' if low_open else 'at least'} {_num(low)} and {'below' if high_open else 'at most'} {_num(high)}"


def _num(x: float) -> str:
    if not float(x).is_integer():
        return f"{x:g}"
    return f"{int(x):,}" if abs(x) >= 100_000 else str(int(x))


def _dur(seconds: float) -> str:
    """A range end as a duration option takes it: `1d`, `12h`, `10m`, `0.5s`."""
    for unit, size in (("d", DAY), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def duration(low_s: float, high_s: float, *, zero: bool = False) -> ArgType[float]:
    """Seconds from `90s`, `10m`, `2h`, `1h30m`, `1d`, between low_s and high_s (0 too when `zero`:
    an option whose 0 switches something off)."""

    def parse(text: str) -> float:
        try:
            value = parse_duration(_short(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if zero and value == 0:
            return 0.0
        if not math.isfinite(value) or not low_s <= value <= high_s:
            raise argparse.ArgumentTypeError(
                f"must be a duration from {_dur(low_s)} to {_dur(high_s)}{' (or 0)' if zero else ''}, got {text!r}"
            )
        return value

    return typed(parse, "duration", f"{'0 or ' if zero else ''}{_dur(low_s)} to {_dur(high_s)}")


def pid_max(path: str = PID_MAX_FILE) -> int:
    """The largest pid this system hands out."""
    try:
        with open(path) as f:
            return int(f.read(32).strip()) - 1 or PID_MAX_DEFAULT
    except (OSError, ValueError):
        return PID_MAX_DEFAULT


def pid(text: str) -> int:
    value = _integer(text)
    highest = pid_max()
    if not 1 <= value <= highest:
        raise argparse.ArgumentTypeError(
            f"must be a process id from 1 to {highest} (this system's pid_max - 1), got {text}"
        )
    return value


typed(pid, "pid", "1 to pid_max")
port = integer(1, 65535, kind="port")
seed = integer(0, SEED_MAX, kind="seed")

# the CLI's numbers, each with its range
positive_number = real(0, 1_000_000, low_open=True)
count = integer(1, 1_000_000)
open_unit_interval = real(0, 1, low_open=True, high_open=True, kind="probability")
half_open_unit_interval = real(0, 1, high_open=True, kind="probability")
positive_duration = duration(1, 365 * DAY)

_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def host(text: str) -> str:
    """An IP address or a DNS host name (what a socket can bind to or connect to)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    if (
        0 < len(name) <= 253
        and all(_HOST_LABEL.match(label) for label in name.split("."))
        and not name.replace(".", "").isdigit()
    ):
        return text
    raise argparse.ArgumentTypeError(f"expected an IP address or a host name, got {text[:80]!r}")


typed(host, "host", "an IP address or host name")


def http_url(text: str) -> str:
    """An http(s) URL with a host and, if it names one, a port from 1 to 65535."""
    if len(text) > MAX_TEXT_CHARS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TEXT_CHARS} characters, got {len(text)}")
    parts = urllib.parse.urlsplit(text)
    try:
        given_port = parts.port
    except ValueError:
        raise argparse.ArgumentTypeError(f"the port of {_shown(parts)} must be from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL (like http://127.0.0.1:8000): {_shown(parts)}")
    if given_port == 0:
        raise argparse.ArgumentTypeError(f"the port of {_shown(parts)} must be from 1 to 65535")
    return text


def _shown(parts: urllib.parse.SplitResult) -> str:
    from .contracts.redact import redact_url

    return repr(redact_url(urllib.parse.urlunsplit(parts))[:200])


typed(http_url, "url", "an http(s) URL")


def text(value: str) -> str:
    """Free text (a name, an id, a command): anything printable, within MAX_TEXT_CHARS."""
    if len(value) > MAX_TEXT_CHARS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TEXT_CHARS} characters, got {len(value)}")
    return value


typed(text, "text")
