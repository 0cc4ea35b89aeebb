"""Shared test helpers: free loopback ports and the repository's paths."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

# Every Ray cluster a test starts (in this process or a CLI it runs) stays on 127.0.0.1: Ray would
# otherwise advertise the machine's network address (see soakmatrix.matrix.cluster.loopback_only).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "matrix" / "examples"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


@pytest.fixture(autouse=True)
def default_sigint():
    """Every test starts with Ctrl-C at Python's default. A library that leaves SIGINT ignored in
    the test process would make every later subprocess ignore it too (an ignored signal survives
    exec), and the Ctrl-C tests would then wait for a driver that never hears them."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
