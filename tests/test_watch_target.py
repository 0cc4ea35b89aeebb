"""Finding the server's processes from a pid or the port's listener; /proc without ptrace."""

import os
import socket

import pytest

from soakmatrix.jobs.watch.target import Target, listener_pid, proc_snapshot


def test_url_parsing_and_bad_urls():
    t = Target("http://127.0.0.1:8000/")
    assert (t.host, t.port, t.base_url) == ("127.0.0.1", 8000, "http://127.0.0.1:8000")
    with pytest.raises(ValueError):
        Target("127.0.0.1:8000")


def test_listener_of_a_port_is_found_and_replaces_a_dead_pid():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert listener_pid(port) == (os.getpid(), None)
        t = Target(f"http://127.0.0.1:{port}", pid=2**31 - 2)   # a pid from before a restart
        assert t.resolve() == os.getpid()
        assert str(os.getpid()) in t.describe()


def test_nothing_listening_says_why():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pid, why = listener_pid(port)
    assert pid is None and f"port {port}" in why


def test_proc_snapshot_reads_threads_and_states():
    snap = proc_snapshot(os.getpid())
    assert snap["pid"] == os.getpid() and snap["threads"] and "state" in snap
