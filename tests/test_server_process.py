"""Starting an engine (jobs/server_process.py): own process group, log capture, readiness, start-up
failures as outcomes."""

import getpass
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from tests.fake_openai import foreign_models_server, start_fake

from soakmatrix.jobs import server_process
from soakmatrix.jobs.server_process import classify_startup_failure
from soakmatrix.matrix.contracts.outcomes import Outcome

FAKE = str(Path(__file__).resolve().parent / "fake_openai.py")

# What vLLM leaves in its temp dir: a ZMQ IPC socket named by a uuid4 (VLLM_RPC_BASE_PATH) and
# torch.distributed's vllm_dist_<uuid> file (tempfile.gettempdir(), i.e. TMPDIR), and it opens torch
# inductor's default cache dir (TMPDIR too); then it says where they are and waits to be stopped.
LEAVES_TEMP_FILES = """
import getpass, json, os, socket, sys, tempfile, time
tmp = tempfile.gettempdir()
inductor = os.path.join(tmp, "torchinductor_" + getpass.getuser())   # torch's default cache dir
os.makedirs(inductor, exist_ok=True)
ipc = socket.socket(socket.AF_UNIX)
ipc.bind(os.path.join(os.environ.get("VLLM_RPC_BASE_PATH", tmp), "0b9e1c2a-5d4f-4e3b-9a8c-7f6e5d4c3b2a"))
ipc.listen()
with open(os.path.join(tmp, "vllm_dist_0b9e1c2a5d4f4e3b9a8c7f6e5d4c3b2a"), "w") as f:
    f.write("store")
print("TEMP " + json.dumps({"tmp": tmp, "TMPDIR": os.environ.get("TMPDIR"),
                            "rpc": os.environ.get("VLLM_RPC_BASE_PATH"),
                            "inductor": os.path.realpath(inductor)}), flush=True)
time.sleep(600)
"""


def temp_report(server, timeout_s: float = 30.0) -> dict:
    """What LEAVES_TEMP_FILES printed once its files exist."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in server.log_text().splitlines():
            if line.startswith("TEMP "):
                return json.loads(line[5:])
        assert server.poll() is None, server.log_text()
        time.sleep(0.1)
    raise AssertionError(f"no TEMP line after {timeout_s} s: {server.log_text()}")


def run_leaving_temp_files(tmp_path, port, env: dict):
    """Start LEAVES_TEMP_FILES with `env`, read its report, stop it: (server, report, teardown)."""
    server = server_process.launch_argv([sys.executable, "-c", LEAVES_TEMP_FILES], tmp_path, port, env=env)
    try:
        seen = temp_report(server)
    finally:
        teardown = server.stop(grace_s=2)
    return server, seen, teardown


@pytest.mark.parametrize("code,log,outcome,needle", [
    (2, "usage: vllm serve [-h]\nvllm serve: error: argument --max-num-seqs: invalid int value: 'x'",
     Outcome.CONFIG_ERROR, "invalid int value"),
    (1, "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
        "  Value error, Unsupported speculative method: 'mtp'", Outcome.CONFIG_ERROR, "SpeculativeConfig"),
    (1, "OSError: [Errno 98] Address already in use", Outcome.INFRA_ERROR, "Address already in use"),
    (1, "Segmentation fault", Outcome.INFRA_ERROR, "exited (1)"),
    (None, "Loading weights...", Outcome.INFRA_ERROR, "not ready after"),
])
def test_startup_failures_are_classified_never_as_hangs(code, log, outcome, needle):
    failure = classify_startup_failure(code, log, waited_s=30)
    assert failure.outcome == outcome and needle in failure.message


@pytest.mark.slow
def test_a_started_server_is_ready_in_its_own_group_with_its_log(tmp_path):
    server, failure = start_fake(tmp_path, "--child")
    try:
        assert failure is None
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)
        kids = psutil.Process(server.pid).children()
        assert kids and all(os.getpgid(k.pid) == server.pid for k in kids)
        assert "fake server on" in (tmp_path / "server.log").read_text()
    finally:
        report = server.stop(grace_s=5)
    assert report.clean and server.poll() is not None


@pytest.mark.slow
def test_usage_error_is_a_config_error(tmp_path):
    server, failure = start_fake(tmp_path, "--no-such-flag")
    try:
        pass
    finally:
        server.stop(grace_s=2)
    assert failure.outcome == Outcome.CONFIG_ERROR and failure.exit_code == 2
    assert "unrecognized arguments: --no-such-flag" in failure.message
    assert not server_process.port_taken(failure)
    assert server.tmp_dir is not None and not server.tmp_dir.exists()   # gone on a start-up failure too


def test_a_port_race_is_recognised():
    failure = classify_startup_failure(1, "OSError: [Errno 98] error while attempting to bind on address "
                                          "('127.0.0.1', 8000): Address already in use", 1)
    assert server_process.port_taken(failure) and failure.outcome == Outcome.INFRA_ERROR


def test_a_port_answered_by_another_process_is_a_lost_race_not_a_ready_server(tmp_path):
    # our server never binds (it is still starting); another process took the free port and answers
    # /v1/models there: that is not our server being ready (a soak would load someone else's server,
    # and ours would die with "address already in use" and read as a crash)
    foreign = foreign_models_server()
    port = foreign.server_address[1]
    server = server_process.launch_argv([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, port)
    try:
        assert server_process.listening_pids(port) == {os.getpid()}
        assert server.port_held_by_another() == os.getpid()
        failure = server.wait_ready(10)
    finally:
        server.stop(grace_s=2)
        foreign.shutdown()
        foreign.server_close()
    assert failure is not None and server_process.port_taken(failure), failure
    assert f"answered from pid {os.getpid()}" in failure.message


@pytest.mark.slow
def test_a_server_that_holds_its_own_port_is_ready(tmp_path, port):
    server = server_process.launch_argv([sys.executable, FAKE, "--port", str(port)], tmp_path, port)
    try:
        assert server.wait_ready(60) is None
        assert server.port_held_by_another() is None
        assert server.pid in server_process.listening_pids(port)
    finally:
        server.stop(grace_s=2)


@pytest.mark.slow
def test_never_ready_is_an_infra_error_and_stop_cancels(tmp_path, port):
    server = server_process.launch_argv([sys.executable, FAKE, "--port", str(port), "--startup-s", "60"],
                                        tmp_path, port)
    try:
        failure = server.wait_ready(1.5)
        assert failure.outcome == Outcome.INFRA_ERROR and "not ready" in failure.message
        stop = threading.Event()
        stop.set()
        assert server.wait_ready(60, stop).message == "cancelled"
    finally:
        report = server.stop(grace_s=2)
    assert report.clean and not server.tmp_dir.exists()


@pytest.mark.slow
def test_each_server_gets_a_private_temp_dir_that_stop_removes(tmp_path, port):
    server = server_process.launch_argv([sys.executable, "-c", LEAVES_TEMP_FILES], tmp_path, port)
    try:
        seen = temp_report(server)
        private = server.tmp_dir
        assert private is not None and seen["tmp"] == seen["TMPDIR"] == seen["rpc"] == str(private)
        assert private.parent == Path(tempfile.gettempdir()) and private.name.startswith("soakmatrix-")
        sock = private / "0b9e1c2a-5d4f-4e3b-9a8c-7f6e5d4c3b2a"
        assert stat.S_ISSOCK(sock.stat().st_mode) and len(str(sock)) < 108
        assert (private / "vllm_dist_0b9e1c2a5d4f4e3b9a8c7f6e5d4c3b2a").read_text() == "store"
        # torch inductor's cache (precompiled headers) is the system temp dir's, shared by all servers
        shared = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
        assert seen["inductor"] == os.path.realpath(shared)
        # a second server does not share it
        other = server_process.launch_argv([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "b",
                                           server_process.free_port())
        try:
            assert other.tmp_dir is not None and other.tmp_dir != private
        finally:
            other.stop(grace_s=2)
        assert not other.tmp_dir.exists() and private.exists()
    finally:
        report = server.stop(grace_s=2)
    assert report.clean and not private.exists() and shared.is_dir()


@pytest.fixture
def short_dir():
    """A folder whose path leaves room for a Unix socket's name (108 bytes in all): pytest's tmp_path
    under an xdist worker (`.../popen-gw1/test_an_explicit_tmpdir_is_res0/`) does not."""
    path = Path(tempfile.mkdtemp(prefix="sm-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_an_explicit_tmpdir_is_respected_and_kept(tmp_path, port, short_dir):
    mine = short_dir
    server, seen, report = run_leaving_temp_files(tmp_path, port, {"TMPDIR": str(mine)})
    assert server.tmp_dir is None
    assert seen["tmp"] == seen["TMPDIR"] == str(mine)
    assert seen["rpc"] == os.environ.get("VLLM_RPC_BASE_PATH")   # not set by us: vLLM uses TMPDIR
    assert report.clean
    assert sorted(p.name for p in mine.iterdir()) == ["0b9e1c2a-5d4f-4e3b-9a8c-7f6e5d4c3b2a",
                                                      f"torchinductor_{getpass.getuser()}",
                                                      "vllm_dist_0b9e1c2a5d4f4e3b9a8c7f6e5d4c3b2a"]
    assert not (mine / f"torchinductor_{getpass.getuser()}").is_symlink()   # nothing of ours in it


@pytest.mark.slow
def test_an_explicit_rpc_base_path_wins_and_tmpdir_is_still_private(tmp_path, port, short_dir):
    rpc = short_dir
    server, seen, _ = run_leaving_temp_files(tmp_path, port, {"VLLM_RPC_BASE_PATH": str(rpc)})
    assert seen["rpc"] == str(rpc) and seen["TMPDIR"] == str(server.tmp_dir)
    assert not server.tmp_dir.exists() and (rpc / "0b9e1c2a-5d4f-4e3b-9a8c-7f6e5d4c3b2a").exists()


NICED_START = """
import os, sys
from soakmatrix.jobs import server_process
from soakmatrix.jobs.engines.protocol import LaunchCommand

os.nice(15)   # as a Ray worker runs
server = server_process.start(LaunchCommand([sys.executable, "-c", "import time; time.sleep(30)"]), sys.argv[1],
                              "127.0.0.1", 9)
try:
    print(os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, server.pid))
finally:
    server.stop(grace_s=1)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority needs root or CAP_SYS_NICE")
def test_an_engine_started_from_a_niced_ray_worker_runs_at_normal_priority(tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-c", NICED_START, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["15", "0"]
