"""LastingStream: progress whose reader went away goes on in a file, and the work is not ended."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
from soakmatrix.matrix.lasting_stream import LastingStream

pytestmark = pytest.mark.slow   # the CLI's commands run as subprocesses with their streams closed


def closed_pipe() -> io.TextIOWrapper:
    """The writing end of a pipe whose reader has gone (line-buffered, as stderr is)."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    return io.TextIOWrapper(os.fdopen(write_fd, "wb", buffering=0), encoding="utf-8", line_buffering=True)


def test_writes_before_the_reader_goes_reach_it_and_later_ones_the_file(tmp_path):
    read_fd, write_fd = os.pipe()
    pipe = io.TextIOWrapper(os.fdopen(write_fd, "wb", buffering=0), encoding="utf-8", line_buffering=True)
    stream = LastingStream(pipe, tmp_path / "out" / "progress.log")
    stream.write("start cell a\n")
    assert os.read(read_fd, 100) == b"start cell a\n"
    os.close(read_fd)

    stream.write("start cell b\n")          # the first write that cannot reach the reader
    print("results: 2 passed", file=stream, flush=True)

    log = (tmp_path / "out" / "progress.log").read_text()
    assert "the reader of this progress went away" in log.splitlines()[0]
    assert log.splitlines()[1:] == ["start cell b", "results: 2 passed"]
    assert stream.gone and not stream.isatty()
    pipe.flush()                            # /dev/null stands in for the dead pipe: no second error
    stream.close()


def test_without_a_file_named_the_writes_are_dropped_and_divert_names_one_later(tmp_path):
    stream = LastingStream(closed_pipe())
    assert stream.write("lost\n") == 5
    stream.flush()
    stream.divert(tmp_path / "progress.log")
    stream.write("kept\n")
    stream.flush()
    assert (tmp_path / "progress.log").read_text().splitlines()[1:] == ["kept"]


def test_a_fallback_that_cannot_be_written_drops_the_lines_rather_than_end_the_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    stream = LastingStream(closed_pipe(), blocker / "progress.log")   # its folder is a file
    stream.write("line\n")
    stream.flush()
    assert stream.gone and stream.fallback is None


def test_other_errors_of_the_stream_are_not_taken_for_a_reader_gone():
    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    stream = LastingStream(Full())
    try:
        stream.write("x\n")
    except OSError as exc:
        assert exc.errno == 28
    else:
        raise AssertionError("ENOSPC was swallowed")
    assert not stream.gone


def test_the_interpreter_exits_cleanly_with_its_own_code_after_the_reader_went_away(tmp_path):
    """What a command sees: stderr's reader gone mid-run, the work finishes and exits as it would."""
    script = textwrap.dedent(f"""
        import sys
        from soakmatrix.matrix.lasting_stream import LastingStream
        sys.stderr = LastingStream(sys.stderr, {str(tmp_path / 'progress.log')!r})
        print("first", file=sys.stderr, flush=True)
        sys.stdin.readline()                  # the reader is gone by now
        for i in range(100):
            print(f"cell {{i}} done", file=sys.stderr, flush=True)
        sys.exit(1)                           # "hangs found": the verdict, not 141
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr.readline() == b"first\n"
    proc.stderr.close()
    proc.stdin.write(b"\n")
    proc.stdin.close()
    assert proc.wait(60) == 1
    lines = (tmp_path / "progress.log").read_text().splitlines()
    assert lines[1:] == [f"cell {i} done" for i in range(100)]


def test_a_terminals_redraws_become_plain_lines_in_the_file(tmp_path):
    stream = LastingStream(closed_pipe(), tmp_path / "progress.log")
    stream.write("\r\x1b[2K3/20 done | 2 running")      # a status line drawn in place
    stream.write("\r\x1b[2Khang     cell-a  (hang, shm_broadcast_timeout)\n")
    stream.write("plain line\n")
    stream.flush()
    assert (tmp_path / "progress.log").read_text().splitlines()[1:] == [
        "3/20 done | 2 running", "hang     cell-a  (hang, shm_broadcast_timeout)", "plain line"]


def test_it_stands_in_for_stderr_where_libraries_look_for_a_text_stream(tmp_path):
    import copy
    import logging

    stream = LastingStream(closed_pipe(), tmp_path / "progress.log")
    assert stream.encoding == "utf-8" and stream.fileno() >= 0
    handler = logging.StreamHandler(stream)            # what Ray's and vLLM's loggers do with stderr
    logger = logging.getLogger("soakmatrix.test_lasting_stream")
    logger.addHandler(handler)
    try:
        logger.warning("a warning after the reader went away")
    finally:
        logger.removeHandler(handler)
    stream.writelines(["one\n", "two\n"])
    copy.copy(stream)                                  # no recursion through __getattr__
    assert (tmp_path / "progress.log").read_text().splitlines()[1:] == [
        "a warning after the reader went away", "one", "two"]


def _close_stdout_and_stderr() -> None:
    os.close(1)
    os.close(2)


def test_standard_streams_closed_at_start_become_dev_null_before_any_file_takes_their_numbers(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys
        from soakmatrix.matrix.lasting_stream import reopen_closed_standard_streams
        closed = reopen_closed_standard_streams()
        store = os.open({str(tmp_path / 'store.db')!r}, os.O_CREAT | os.O_WRONLY)
        print("to nobody"); print("to nobody either", file=sys.stderr)
        os.write(2, b"a C library's log line\\n")          # must not land in the store
        with open({str(tmp_path / 'seen.txt')!r}, "w") as f:
            f.write(f"{{sorted(closed)}} {{store}}")
    """)
    proc = subprocess.run([sys.executable, "-c", script], preexec_fn=_close_stdout_and_stderr, timeout=60)
    assert proc.returncode == 0
    closed, store_fd = (tmp_path / "seen.txt").read_text().rsplit(" ", 1)
    assert closed == "['stderr', 'stdout']" and int(store_fd) > 2
    assert (tmp_path / "store.db").read_bytes() == b""


def test_cli_commands_with_their_output_closed_do_their_work(tmp_path):
    """`soakmatrix plan M >&-` was an internal error (sys.stdout is None); a bisection started with
    stderr closed writes its progress to --out's progress.log from the start."""
    from tests.conftest import EXAMPLES, REPO

    cli = [sys.executable, "-m", "soakmatrix.matrix.cli"]
    plan = subprocess.run([*cli, "plan", str(EXAMPLES / "demo.yaml")], preexec_fn=_close_stdout_and_stderr,
                          cwd=REPO, timeout=120)
    assert plan.returncode == 0
    cell = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"
    out = tmp_path / "out"
    bisect = subprocess.run([*cli, "bisect", str(EXAMPLES / "demo.yaml"), "--cell", cell, "--virtual", "--seed", "3",
                             "--out", str(out)], preexec_fn=lambda: os.close(2), stdout=subprocess.PIPE,
                            cwd=REPO, timeout=300)
    assert bisect.returncode == 1 and b"minimal" in bisect.stdout.lower()
    log = (out / "progress.log").read_text().splitlines()
    assert sum(line.startswith("probe ") for line in log) >= 4
