"""Thread stacks and tracebacks read from text: py-spy dumps, faulthandler dumps (vLLM's
`VLLM_STACK_DUMP_*` files) and the Python tracebacks a server log prints, each thread or traceback as
its frames, innermost first. What the frames mean (the culprit, the signature, the fingerprint) is
`jobs.culprit`'s and `jobs.signatures`' to say.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    function: str
    location: str = ""  # file:line or library, as the dump printed it

    @property
    def name(self) -> str:
        """The bare function name: py-spy 0.4 prints `Class.method`, tracebacks print `method`."""
        return self.function.rsplit(".", 1)[-1] if "::" not in self.function else self.function

    def __str__(self) -> str:
        return f"{self.function} ({self.location})" if self.location else self.function


@dataclass(frozen=True)
class ThreadStack:
    process: str  # "pid: cmdline" when known
    thread: str  # thread name or id
    frames: tuple[Frame, ...]  # innermost (most recent call) first
    active: bool | None = None  # py-spy's (active)/(idle) mark


_PYSPY_PROCESS = re.compile(r"^Process (\d+): (.*)$")
_PYSPY_THREAD = re.compile(r'^Thread (\S+) \((\w+)\)(?:: "(.*)")?')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?)\s+\((?P<loc>[^()]*)\)\S*(?:\s.*)?$")
_FAULTHANDLER_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FAULTHANDLER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def parse_stacks(text: str) -> list[ThreadStack]:
    """Threads from py-spy dump output or faulthandler dumps (several may be concatenated)."""
    threads: list[ThreadStack] = []
    process = ""
    current: dict | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            threads.append(ThreadStack(process, current["thread"], tuple(current["frames"]), current["active"]))
        current = None

    for line in text.splitlines():
        if m := _PYSPY_PROCESS.match(line):
            close()
            process = f"{m.group(1)}: {m.group(2)}"
        elif m := _PYSPY_THREAD.match(line):
            close()
            current = {
                "thread": m.group(3) or m.group(1),
                "frames": [],
                "active": {"active": True, "idle": False}.get(m.group(2)),
            }
        elif m := _FAULTHANDLER_THREAD.match(line):
            close()
            current = {"thread": m.group(1), "frames": [], "active": None}
        elif current is not None and (m := _FAULTHANDLER_FRAME.match(line)):
            current["frames"].append(Frame(m.group("func"), f"{_short(m.group('file'))}:{m.group('line')}"))
        elif current is not None and (m := _PYSPY_FRAME.match(line)):
            current["frames"].append(Frame(m.group("func").strip(), m.group("loc").strip()))
        elif current is not None and not line.strip():
            close()
    close()
    return threads


def log_tracebacks(lines: Sequence[str]) -> list[tuple[Frame, ...]]:
    """Python tracebacks printed in a log, each innermost frame first."""
    blocks: list[list[Frame]] = []
    current: list[Frame] = []
    for line in lines:
        m = _TRACEBACK_FRAME.match(_strip_log_prefix(line))
        body = _LOG_PREFIX.sub("", line, count=1)
        if m:
            current.append(Frame(m.group("func"), f"{_short(m.group('file'))}:{m.group('line')}"))
        elif body.lstrip().startswith(("Traceback", "The above exception", "During handling")) or not body.strip():
            if current:
                blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return [tuple(reversed(b)) for b in blocks]


# What vLLM puts before each line a process prints: "(EngineCore_DP0 pid=123) ERROR 11-27 15:11:03
# [core.py:866] ", or only the process. Without it off, one process's tracebacks (and the blank lines
# between them) run into one block with the next process's.
_LOG_PREFIX = re.compile(r"^\s*(?:\([^()]*pid=\d+\)\s?)?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?)?")


def _strip_log_prefix(line: str) -> str:
    # vLLM prefixes every line of a worker's traceback with "(EngineCore pid=123) ERROR ...".
    m = re.search(r'File "', line)
    return line[m.start() :] if m else line


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else path
