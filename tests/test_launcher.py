"""The launcher: own process group, log capture, readiness, start-up failures as outcomes."""

import os
import sys
import threading
from pathlib import Path

import psutil
import pytest

from fake_openai import start_fake
from soakmatrix.jobs import launcher
from soakmatrix.jobs.launcher import classify_startup_failure
from soakmatrix.matrix.outcomes import Outcome

FAKE = str(Path(__file__).resolve().parent / "fake_openai.py")


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
    assert not launcher.port_taken(failure)


def test_a_port_race_is_recognised():
    failure = classify_startup_failure(1, "OSError: [Errno 98] error while attempting to bind on address "
                                          "('127.0.0.1', 8000): Address already in use", 1)
    assert launcher.port_taken(failure) and failure.outcome == Outcome.INFRA_ERROR


@pytest.mark.slow
def test_never_ready_is_an_infra_error_and_stop_cancels(tmp_path, port):
    server = launcher.launch_argv([sys.executable, FAKE, "--port", str(port), "--startup-s", "60"], tmp_path, port)
    try:
        failure = server.wait_ready(1.5)
        assert failure.outcome == Outcome.INFRA_ERROR and "not ready" in failure.message
        stop = threading.Event()
        stop.set()
        assert server.wait_ready(60, stop).message == "cancelled"
    finally:
        report = server.stop(grace_s=2)
    assert report.clean
