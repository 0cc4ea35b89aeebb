"""Shared test helpers: free loopback ports and the repository's paths."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

# Every Ray cluster a test starts (in this process or a CLI it runs) stays on 127.0.0.1: Ray would
# otherwise advertise the machine's network address (see soakmatrix.matrix.schedule.cluster.loopback_only).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

# `make test` runs the suite on two pytest-xdist workers. What a test starts (a pytest of its own
# with the soak plugin, a CLI) must not believe it is an xdist worker: the plugin splits GPUs by
# these variables. The worker itself reads its identity from its workerinput, not from them.
for _name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
    os.environ.pop(_name, None)

import pytest

from soakmatrix.jobs.server_process import free_port   # tests import it from here too
# how the suite runs on xdist workers (the real engine's tests first, a test whose worker died run
# again): tests/xdist_suite.py, whose hooks are this conftest's
from tests import xdist_suite
from tests.xdist_suite import pytest_handlecrashitem, pytest_report_teststatus, pytest_terminal_summary  # noqa: F401 - hooks

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "matrix" / "examples"


def running(process) -> bool:
    """A psutil process still running: neither gone nor a zombie waiting for its parent."""
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_ray_cluster(head_node_args, nodes=None, attempts: int = 3, ready=None):
    """A `ray.cluster_utils.Cluster` (head plus `nodes`: name -> add_node kwargs) with this process
    connected as its driver: (cluster, {name: node}). `head_node_args` is a dict or a function
    returning one (fresh ports per attempt). On a loaded machine a node can miss Ray's 30 s start-up
    window ("node timed out during startup"): the partial cluster is shut down and the start tried
    again, as `soakmatrix.matrix.schedule.cluster.start_local` does; its head's agent takes a free
    port, as there (HEAD_PORTS). `ready(cluster)` raises when a started cluster is not yet usable
    after all (then it is shut down and started again too)."""
    import ray
    from ray.cluster_utils import Cluster

    from soakmatrix.matrix.schedule.cluster import HEAD_PORTS, retry_start

    # Cluster() writes the head's address to the default temp dir's `ray_current_cluster` even when
    # the head has a temp dir of its own; on a fresh machine where no Ray has run, that folder is
    # missing and the start fails (seen running test_run_cli.py alone on a new machine)
    from ray._private.utils import get_ray_address_file
    Path(get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)

    def once():
        cluster = None
        try:
            args = head_node_args() if callable(head_node_args) else head_node_args
            cluster = Cluster(initialize_head=True, head_node_args={**HEAD_PORTS, **args})
            added = {name: cluster.add_node(**kwargs) for name, kwargs in (nodes or {}).items()}
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
            if ready is not None:
                ready(cluster)
            return cluster, added
        except BaseException:
            try:
                if ray.is_initialized():
                    ray.shutdown()
                if cluster is not None:
                    cluster.shutdown()
            except Exception:  # noqa: BLE001 - the start's own error is the one to report
                pass
            raise

    return retry_start(once, attempts, what="the test's Ray cluster")


class ClientCluster(str):
    """The `ray://` address of a test cluster's Ray Client server, which can also tell what that
    server logged (a failed client start names only a log file on the head node)."""

    logs: Path

    def server_logs(self, tail: int = 3000) -> str:
        parts = []
        for log in sorted(self.logs.glob("ray_client_server*")):
            text = log.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {log.name} ---\n{text[-tail:]}")
        return "\n".join(parts) or f"(no Ray Client server log in {self.logs})"


def wait_for_client_server(port: int, logs: Path, timeout_s: float = 90.0) -> None:
    """Until the head's Ray Client server listens on `port`. Ray starts that server as a process of
    its own, which on a loaded machine can die at its start ("Timed out waiting for node info") and
    leave nothing at the port; then (its log says so, or the port stays shut) this raises, and the
    cluster is started again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
            return
        except OSError:
            died = [log.name for log in logs.glob("ray_client_server*.err")
                    if "Traceback" in log.read_text(errors="replace")]
            if died or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray Client server on port {port} "
                                   + (f"died at its start ({', '.join(died)})" if died else f"did not listen in {timeout_s:.0f} s"))
            time.sleep(0.5)


@contextlib.contextmanager
def ray_client_cluster(h200: dict):
    """A cluster whose head (no GPUs) runs the Ray Client server, with one H200 node (`h200`: its
    add_node kwargs but the accelerator resource); yields the `ray://` address a driver outside the
    cluster uses (a `ClientCluster`), and shuts the cluster down after. This process does not stay its
    driver."""
    import ray

    with ray_client_ports():
        yield from _ray_client_cluster(h200, ray)


@contextlib.contextmanager
def ray_client_ports():
    """Held while a test's Ray Client server lives. Every Ray Client server on a machine hands its
    sessions ports counted up from 23000, so two at once (two xdist workers, two CI runs) collide
    ("SpecificServer startup failed"); a lock file in the temp folder makes them take turns."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "soakmatrix-tests-ray-client.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ray_client_cluster(h200: dict, ray):
    client = {}

    def head_node_args():   # fresh ports for each attempt
        client["port"] = free_port()
        return {"num_cpus": 1, "num_gpus": 0, "ray_client_server_port": client["port"]}

    def client_server_listens(cluster) -> None:
        wait_for_client_server(client["port"], Path(cluster.head_node.get_logs_dir_path()))

    cluster, _ = start_ray_cluster(head_node_args, {"h200": dict(h200, resources={"accelerator_type:H200": 1})},
                                   ready=client_server_listens)
    ray.shutdown()
    address = ClientCluster(f"ray://127.0.0.1:{client['port']}")
    address.logs = Path(cluster.head_node.get_logs_dir_path())
    try:
        yield address
    finally:
        cluster.shutdown()


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


def pytest_configure(config):
    """What the suite says while it runs long, and its limits (tests/suite_watch.py): a plugin of its own,
    as its hooks share names with xdist_suite's."""
    from tests import suite_watch
    if not config.pluginmanager.is_registered(suite_watch):
        config.pluginmanager.register(suite_watch, "soakmatrix-suite-watch")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:   # a test that runs a pytest of its own in a subprocess is an end-to-end one
        if "pytester" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):   # the order a worker reports is the order units are handed out
        xdist_suite.suite_order(items, int(config.workerinput.get("workercount", 1)))
