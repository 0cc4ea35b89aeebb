"""The simulated engine's hang record: written off the caller's thread, on disk once closed."""

from __future__ import annotations

import json
import os
import threading
import time

from soakmatrix.jobs.sim.hang_record import HangRecorder


def test_lines_are_appended_and_on_disk_after_close(tmp_path) -> None:
    path = tmp_path / "deeper" / "sim-hangs.jsonl"
    recorder = HangRecorder(str(path))
    recorder.write({"hang_id": "a", "began_at": 1.5})
    recorder.write({"hang_id": "b", "began_at": 2.5})
    recorder.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["hang_id"] for r in lines) == ["a", "b"]


def test_a_blocked_file_does_not_block_the_caller(tmp_path) -> None:
    """A FIFO with no reader blocks its writer's open(); the engine thread must not wait for it, and
    the record still arrives (fsync on a pipe fails; the line is written all the same)."""
    path = tmp_path / "sim-hangs.jsonl"
    os.mkfifo(path)
    recorder = HangRecorder(str(path))
    t0 = time.monotonic()
    recorder.write({"hang_id": "stuck-disk"})
    assert time.monotonic() - t0 < 5.0      # a writer blocked on the FIFO would wait for ever
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(path.read_text()), daemon=True)
    reader.start()
    recorder.close(timeout_s=10)
    reader.join(timeout=10)
    assert json.loads(got[0]) == {"hang_id": "stuck-disk"}


def test_no_path_writes_nothing(tmp_path) -> None:
    recorder = HangRecorder(None)
    recorder.write({"hang_id": "x"})
    recorder.close()
    assert list(tmp_path.iterdir()) == []
