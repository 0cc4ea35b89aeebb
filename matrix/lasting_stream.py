"""A text stream for progress that outlives its reader.

A nightly run is hours of GPU work whose results go to the history store, JUnit and the dashboard;
its progress on stderr is only for whoever watches. When that reader goes away (`| tee` killed, a
CI log pipe closed, `2>&1 | head`, or the terminal hung up: EIO), every later write raises, and
without this the first one ended the run with nothing soaked (the demo: 3 lines, exit 141, 20
cells unrun). Here the first failed write diverts the stream, for good, to a file beside the run's
output (`divert` names it once the output folder is known), or drops what is written when none is
named; the work goes on and exits with its own verdict.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import time
from pathlib import Path
from typing import TextIO

# a pipe whose reader closed; a terminal that hung up (the SSH session that ran the nightly closed)
READER_GONE = (errno.EPIPE, errno.EIO)
CLOSED_AT_START: set[str] = set()  # standard streams closed before we started (reopen_closed_standard_streams)


def _reader_gone(exc: Exception) -> bool:
    """The stream's reader went away (a full disk is no such thing: that error stays an error)."""
    if isinstance(exc, OSError):
        return exc.errno in READER_GONE
    return isinstance(exc, ValueError)  # "I/O operation on closed file": somebody closed it for us


class LastingStream:
    """Writes to `stream` until its reader goes away, then to `fallback` (or nowhere)."""

    def __init__(self, stream: TextIO, fallback: str | Path | None = None):
        self.stream = stream
        self.fallback = Path(fallback) if fallback is not None else None
        self.gone = False  # the reader went away
        self._file: TextIO | None = None

    def divert(self, fallback: str | Path) -> None:
        """Name the file that takes the writes once the reader is gone (from then on if it already is)."""
        self.fallback = Path(fallback)

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                n = self.stream.write(text)
                return len(text) if n is None else n
            except (ValueError, OSError) as exc:
                if not _reader_gone(exc):
                    raise
                self._went_away()
        out = self._fallback_file()
        if out is not None:
            out.write(_as_log_text(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
                return
            except (ValueError, OSError) as exc:
                if not _reader_gone(exc):
                    raise
                self._went_away()
        if self._file is not None:
            self._file.flush()

    def isatty(self) -> bool:
        # a status line redrawn in place means nothing in a file
        if self.gone:
            return False
        try:
            return self.stream.isatty()
        except ValueError:
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str):
        # the rest of a text stream (encoding, errors, buffer, name) is the stream's
        if name == "stream":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.stream, name)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _went_away(self) -> None:
        self.gone = True
        # /dev/null in the dead pipe's place: its buffered text would raise again at the
        # interpreter's exit flush, and a child that inherited the descriptor would die of SIGPIPE
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError, AttributeError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)

    def _fallback_file(self) -> TextIO | None:
        if self._file is None and self.fallback is not None:
            try:
                self.fallback.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.fallback, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - close() closes it
            except OSError:
                self.fallback = None  # nowhere to write: the work matters more than its progress lines
                return None
            self._file.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} the reader of this progress went away; it goes on here\n"
            )
        return self._file


TERMINAL_CONTROL = re.compile(r"\r|\x1b\[[0-9;?]*[A-Za-z]")


def _as_log_text(text: str) -> str:
    """What a terminal's writes mean in a file: no redraws (a status line drawn in place ends with
    a newline of its own there), no escape sequences."""
    if "\r" not in text and "\x1b" not in text:
        return text
    plain = TERMINAL_CONTROL.sub("", text)
    return plain if not plain or plain.endswith("\n") or "\r" not in text else plain + "\n"


def divert_stderr(fallback: Path) -> None:
    """Where stderr's writes go once its reader is gone, when stderr is a LastingStream."""
    if isinstance(sys.stderr, LastingStream):
        sys.stderr.divert(fallback)


def reopen_closed_standard_streams() -> set[str]:
    """Descriptors 0-2 closed at start (`>&-`, a daemon that closed them) become /dev/null, and
    Python's stream for each a real one; returns the names of those that were closed. Otherwise the
    next file opened (the history store) takes the free number, and whatever writes to descriptor
    2 below Python (Ray's core, faulthandler) writes into it; and `sys.stdout` is None, so the
    first print is an internal error. `CLOSED_AT_START` keeps the names for what starts later."""
    closed = set()
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            closed.add(name)
        if getattr(sys, name) is None or name in closed:
            # the process's standard stream from now on: nothing closes it, and closefd=False leaves the fd open
            stream = open(  # noqa: SIM115 - it outlives this function on purpose
                fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False, buffering=-1 if fd == 0 else 1
            )
            setattr(sys, name, stream)
    CLOSED_AT_START.update(closed)
    return closed


def gone_from_the_start(stream: LastingStream, name: str) -> LastingStream:
    """`stream` (over sys.`name`) marked gone when that stream was closed at start: nobody reads it."""
    stream.gone = name in CLOSED_AT_START
    return stream
