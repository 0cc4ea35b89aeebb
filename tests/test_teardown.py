"""Teardown: the whole tree goes, leaks are found and carried to the next cell."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from tests.fake_openai import start_fake

from soakmatrix.jobs import server_process as launcher
from soakmatrix.jobs import teardown

FAKE = str(Path(__file__).resolve().parent / "fake_openai.py")


def gone(pids):
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.slow
def test_sigterm_stops_the_tree_and_nothing_remains(tmp_path):
    server, failure = start_fake(tmp_path, "--child")
    assert failure is None
    port = server.port
    pids = [p.pid for p in teardown.tree(server.pid)]
    assert len(pids) == 2
    report = server.stop(grace_s=10)
    assert report.clean and not report.escalated and set(pids) <= set(report.pids)
    assert gone(pids) and not teardown.port_listening(port)


STUBBORN = textwrap.dedent("""
    import signal, socket, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # a grandchild that leaves the process group, as a daemonising helper would
    subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.setsid(); "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_sigterm_ignored_escalates_to_sigkill_including_processes_that_left_the_group(tmp_path, port):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    server = launcher.launch_argv([sys.executable, str(script), str(port)], tmp_path, port)
    deadline = time.monotonic() + 30
    while "ready" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    pids = [p.pid for p in teardown.tree(server.pid)]
    assert len(pids) == 2
    report = server.stop(grace_s=1)
    assert report.escalated and report.clean, report.describe()
    assert gone(pids)


def test_a_leak_is_reported_to_the_next_cell_until_it_is_gone(tmp_path):
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        report = teardown.TeardownReport(pids=[survivor.pid], survivors=[survivor.pid])
        assert not report.clean and "still alive" in report.describe()
        teardown.record_leak(tmp_path, "cell-a", report, port=None)
        problem = teardown.preflight(tmp_path)
        assert problem and "cell cell-a" in problem and str(survivor.pid) in problem
    finally:
        survivor.send_signal(signal.SIGKILL)
        survivor.wait()
    assert teardown.preflight(tmp_path) is None
    assert not teardown.leak_file(tmp_path).exists()


def test_only_our_own_listening_sockets_count_as_a_leak():
    import os
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert teardown.port_listening(port)
        assert teardown.port_listening(port, owners=[os.getpid()])
        assert not teardown.port_listening(port, owners=[os.getpid() + 100000])   # another job's socket
    assert not teardown.port_listening(port)
