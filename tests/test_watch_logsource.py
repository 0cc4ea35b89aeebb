"""Following a log like tail -F (rotation, truncation) or reading it from a stream."""

import io
import time

from soakmatrix.jobs.watch.logsource import FileLog, StreamLog


def test_file_log_starts_at_the_end_keeps_history_and_follows_rotation(tmp_path):
    path = tmp_path / "vllm.log"
    path.write_text("old 1\nold 2\n")
    log = FileLog(path)
    assert log.new_lines() == [] and list(log.recent) == ["old 1", "old 2"]
    with open(path, "a") as f:
        f.write("new 1\npart")
    assert log.new_lines() == ["new 1"]
    with open(path, "a") as f:
        f.write("ial\n")
    assert log.new_lines() == ["partial"]
    path.rename(tmp_path / "vllm.log.1")           # logrotate
    path.write_text("after rotation\n")
    assert log.new_lines() == ["after rotation"]
    path.write_text("")                             # copytruncate (seen between two polls)
    assert log.new_lines() == []
    with open(path, "a") as f:
        f.write("after truncation\n")
    assert log.new_lines() == ["after truncation"]
    assert "after truncation" in log.text()


def test_file_log_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    log = FileLog(tmp_path / "later.log")
    assert log.new_lines() == []
    (tmp_path / "later.log").write_text("first\n")
    assert log.new_lines() == ["first"]


def test_stream_log_hands_over_what_arrived():
    log = StreamLog(io.StringIO("a\nb\n"))
    deadline = time.monotonic() + 5
    got = []
    while len(got) < 2 and time.monotonic() < deadline:
        got += log.new_lines()
        time.sleep(0.01)
    assert got == ["a", "b"] and list(log.recent) == ["a", "b"]
