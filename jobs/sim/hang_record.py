"""The simulated engine's record of when each hang truly began (`--hang-record`, one JSON line each).

The record is the ground truth that tests and benchmarks judge the detectors by, so it is flushed and
fsynced. It is written off the engine thread: the hang's frame must be where the engine is from the
moment the hang begins, as in vLLM. Written on the engine thread, an fsync that a busy disk holds for
a few seconds keeps the engine core inside the write when the detectors fire: its stacks show the
write, not the planted frame, and an `event_sync_stall` reads as a silent stall (the likely cause of
the demo test's failures on loaded CI machines, docs/design/alternatives.md).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any


class HangRecorder:
    """Appends records to `path` (nothing when it is None), each in a thread of its own."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._writers: list[threading.Thread] = []

    def write(self, record: dict[str, Any]) -> None:
        """Returns at once; the line is on disk once `close` returns."""
        if not self.path:
            return
        line = json.dumps(record, sort_keys=True) + "\n"
        writer = threading.Thread(target=self._append, args=(line,), name="hang-record", daemon=True)
        writer.start()
        self._writers.append(writer)

    def _append(self, line: str) -> None:
        path = self.path
        assert path is not None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            try:
                os.fsync(fh.fileno())
            except OSError:  # a pipe, or a filesystem without fsync: the line is written all the same
                pass

    def close(self, timeout_s: float = 10.0) -> None:
        """Waits for the records still being written (an engine that dies of its hang writes first)."""
        for writer in self._writers:
            writer.join(timeout_s)
