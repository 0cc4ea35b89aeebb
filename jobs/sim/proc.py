"""Process plumbing of the simulated engine: vLLM-style log lines, process titles, dying with the parent.

Log lines look like vLLM 0.33's: every line of a process is prefixed with `(NAME pid=PID) ` (vLLM's
`decorate_logs`), then `LEVEL MM-DD HH:MM:SS [file.py:line] message`, and each line of a multi-line
message (a traceback) repeats the header (vLLM's `NewLineFormatter`). The `[file.py:line]` part names
the vLLM source that writes that line in vLLM (`loggers.py`, `shm_broadcast.py`, ...), given by the
caller, so log parsers written against vLLM read the simulator's logs unchanged.
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import signal
import sys
import threading
from typing import Any, TextIO

LOGGER_NAME = "soakmatrix.sim"
_DATEFMT = "%m-%d %H:%M:%S"
_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


class _PrefixedStream(io.TextIOBase):
    """A text stream that starts each line with `(NAME pid=PID) `, like vLLM's decorate_logs."""

    def __init__(self, raw: TextIO, prefix: str) -> None:
        self._raw = raw
        self._prefix = prefix
        self._new_line = True
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        if not s:
            return 0
        with self._lock:
            out = []
            for piece in s.splitlines(keepends=True):
                if self._new_line:
                    out.append(self._prefix)
                out.append(piece)
                self._new_line = piece.endswith("\n")
            self._raw.write("".join(out))
            if self._new_line:
                self._raw.flush()
        return len(s)

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._raw, "encoding", "utf-8")


class VllmFormatter(logging.Formatter):
    """`LEVEL MM-DD HH:MM:SS [src] message`, the header repeated on every line of the message."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(asctime)s [%(src)s] %(message)s", datefmt=_DATEFMT)

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "src"):
            record.src = f"{record.filename}:{record.lineno}"
        text = super().format(record)
        if "\n" in text:
            header = text.split(record.getMessage(), 1)[0] if record.getMessage() else ""
            text = text.replace("\n", "\n" + header)
        return text


def log_level() -> int:
    return getattr(logging, os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(), logging.INFO)


def setup_process_logging(process_name: str) -> logging.Logger:
    """Prefix this process's stdout/stderr like vLLM and send the sim logger there."""
    prefix = f"({process_name} pid={os.getpid()}) "
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        raw = stream._raw if isinstance(stream, _PrefixedStream) else stream
        setattr(sys, name, _PrefixedStream(raw, prefix))
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VllmFormatter())
    logger.addHandler(handler)
    logger.setLevel(log_level())
    logger.propagate = False
    plain = logging.getLogger(LOGGER_NAME + ".plain")  # uvicorn-style `INFO:     ...` lines
    for h in list(plain.handlers):
        plain.removeHandler(h)
    ph = logging.StreamHandler(sys.stderr)
    ph.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    plain.addHandler(ph)
    plain.setLevel(logging.INFO)
    plain.propagate = False
    return logger


def vlog(level: int, src: str, msg: str, *args: Any, exc_info: Any = None) -> None:
    """Log one vLLM-format line whose `[file:line]` is `src`."""
    logging.getLogger(LOGGER_NAME).log(level, msg, *args, extra={"src": src}, exc_info=exc_info)


def plain_log(msg: str, *args: Any) -> None:
    logging.getLogger(LOGGER_NAME + ".plain").info(msg, *args)


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - not Linux
        return None


def set_process_title(title: str) -> None:
    """Make `title` the process's name (`psutil.Process.name()`) and its command line, as vLLM does.

    vLLM uses setproctitle; without it we do what it does on Linux: set the kernel's task name
    (prctl, 15 characters) and overwrite the argv area in place, whose bounds /proc/self/stat gives,
    so `ps`, `pgrep -f` and psutil's cmdline() show the title.
    """
    try:
        import setproctitle

        setproctitle.setproctitle(title)
        return
    except ImportError:
        pass
    libc = _libc()
    if libc is None:
        return
    try:
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # fields[0] is field 3 (state); arg_start, arg_end are fields 48, 49
        arg_start, arg_end = int(fields[45]), int(fields[46])
        size = arg_end - arg_start
        data = title.encode()[: max(0, size - 2)]
        if size <= 2 or not data:
            return
        ctypes.memset(arg_start, 0, size)
        ctypes.memmove(arg_start, data, len(data))
        # a non-NUL last byte tells the kernel to read the title as one NUL-terminated string
        ctypes.memset(arg_end - 1, ord(" "), 1)
    except (OSError, ValueError, IndexError):
        pass


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (no orphans, whatever killed the parent)."""
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def reset_child_signals() -> None:
    """A forked child: default SIGTERM (die), ignore SIGINT (the API server handles Ctrl-C)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
