"""The server's log as a watch reads it: a file followed like `tail -F`, or a stream such as stdin.

`journalctl -fu vllm | soakmatrix watch URL --log -` feeds stdin; a file is followed across rotation
and truncation (a new inode or a shorter file starts over at its beginning). Both keep the latest
lines in memory (`recent`), the log tail of an incident's evidence and the classifier's input.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from soakmatrix.jobs.watchdog import LogFollower

KEEP_LINES = 5000


class _Recent:
    def __init__(self, keep: int = KEEP_LINES) -> None:
        self.recent: deque[str] = deque(maxlen=keep)

    def _keep(self, lines: Sequence[str]) -> list[str]:
        self.recent.extend(lines)
        return list(lines)

    def text(self) -> str:
        return "\n".join(self.recent) + ("\n" if self.recent else "")


class FileLog(_Recent):
    """New lines of a log file since the last call, across rotation; starts at the file's end."""

    def __init__(self, path: str | Path, keep: int = KEEP_LINES, history_bytes: int = 256_000) -> None:
        super().__init__(keep)
        self.path = Path(path)
        self._inode = self._stat_inode()
        self._follow = LogFollower(self.path, from_start=False)
        if self.path.exists():
            self._seed(history_bytes)

    def _stat_inode(self) -> int | None:
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return None

    def _seed(self, history_bytes: int) -> None:
        # the lines before we attached are no news for the detectors, but belong in a log tail
        try:
            with open(self.path, "rb") as f:
                start = max(0, self._follow.offset - history_bytes)
                f.seek(start)
                data = f.read(self._follow.offset - start)
        except OSError:
            return
        lines = data.split(b"\n")[(1 if start else 0) : -1]  # not a line cut in half by the seek
        self.recent.extend(line.decode("utf-8", "replace") for line in lines)

    def new_lines(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if (self._inode is not None and st.st_ino != self._inode) or st.st_size < self._follow.offset:
            self._follow = LogFollower(self.path, from_start=True)  # rotated or truncated
        self._inode = st.st_ino
        return self._keep(self._follow.new_lines())


class StreamLog(_Recent):
    """Lines of a stream (stdin) read by a daemon thread; `new_lines()` hands over what arrived."""

    def __init__(self, stream: IO[str], keep: int = KEEP_LINES) -> None:
        super().__init__(keep)
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.closed = False
        threading.Thread(target=self._read, args=(stream,), name="watch-log", daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self.closed = True

    def new_lines(self, limit: int = 100_000) -> list[str]:
        out: list[str] = []
        while len(out) < limit:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return self._keep(out)
