"""Shared test helpers: free loopback ports and the repository's paths."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
from pathlib import Path

# Every Ray cluster a test starts (in this process or a CLI it runs) stays on 127.0.0.1: Ray would
# otherwise advertise the machine's network address (see soakmatrix.matrix.schedule.cluster.loopback_only).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

# `make test TEST_WORKERS=2` runs the suite on two pytest-xdist workers. What a test starts (a pytest of its own
# with the soak plugin, a CLI) must not believe it is an xdist worker: the plugin splits GPUs by
# these variables. The worker itself reads its identity from its workerinput, not from them.
for _name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
    os.environ.pop(_name, None)

import pytest

from soakmatrix.jobs.server_process import free_port   # tests import it from here too

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "matrix" / "examples"


def start_ray_cluster(head_node_args, nodes=None, attempts: int = 3):
    """A `ray.cluster_utils.Cluster` (head plus `nodes`: name -> add_node kwargs) with this process
    connected as its driver: (cluster, {name: node}). `head_node_args` is a dict or a function
    returning one (fresh ports per attempt). On a loaded machine a node can miss Ray's 30 s start-up
    window ("node timed out during startup"): the partial cluster is shut down and the start tried
    again, as `soakmatrix.matrix.schedule.cluster.start_local` does; its head's agent takes a free
    port, as there (HEAD_PORTS)."""
    import ray
    from ray.cluster_utils import Cluster

    from soakmatrix.matrix.schedule.cluster import HEAD_PORTS, retry_start

    def once():
        cluster = None
        try:
            args = head_node_args() if callable(head_node_args) else head_node_args
            cluster = Cluster(initialize_head=True, head_node_args={**HEAD_PORTS, **args})
            added = {name: cluster.add_node(**kwargs) for name, kwargs in (nodes or {}).items()}
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
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


@contextlib.contextmanager
def ray_client_cluster(h200: dict):
    """A cluster whose head (no GPUs) runs the Ray Client server, with one H200 node (`h200`: its
    add_node kwargs but the accelerator resource); yields the `ray://` address a driver outside the
    cluster uses (a `ClientCluster`), and shuts the cluster down after. This process does not stay its
    driver."""
    import ray

    client = {}

    def head_node_args():   # fresh ports for each attempt
        client["port"] = free_port()
        return {"num_cpus": 1, "num_gpus": 0, "ray_client_server_port": client["port"]}

    cluster, _ = start_ray_cluster(head_node_args, {"h200": dict(h200, resources={"accelerator_type:H200": 1})})
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


# Under `-n 2` (`make test TEST_WORKERS=2`) the tests are handed out a module at a time (a module's fixtures are
# set up once), and the modules with a real-engine test form one unit of work, handed out first:
# two `vllm serve` start-ups side by side on 2 cores would each take minutes, while one beside
# simulated-engine tests takes about what it takes beside a benchmark (docs/vllm.md). That unit is
# the longest, so it starts first and the other worker drains the rest. (xdist's own `loadgroup`
# renames node ids to group them, which pytest 9.2's structured node ids ignore: a scheduler that
# names the scope is what works.)
# The modules that start a Ray Client server share a unit too: each server hands its sessions ports
# counted up from 23000, so two at once collide ("SpecificServer startup failed", seen under -n 2).
REAL_ENGINE_GROUP = "real-engine"
RAY_CLIENT_GROUP = "ray-client"
REAL_ENGINE_MARK = re.compile(r"\bmark\.vllm\b")
RAY_CLIENT_USE = re.compile(r"\bray_client_cluster\(")


@functools.cache
def modules_matching(pattern: re.Pattern) -> frozenset[str]:
    """Test files (names) whose source matches: the same answer in the controller and each worker."""
    return frozenset(path.name for path in Path(__file__).parent.glob("test_*.py") if pattern.search(path.read_text()))


def real_engine_modules() -> frozenset[str]:
    """Test files that mark a test `vllm`."""
    return modules_matching(REAL_ENGINE_MARK)


def work_unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    name = Path(module).name
    if name in real_engine_modules():
        return REAL_ENGINE_GROUP
    return RAY_CLIENT_GROUP if name in modules_matching(RAY_CLIENT_USE) else module


@pytest.hookimpl(optionalhook=True)   # without xdist (`-p no:xdist`) there is no such hook
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModulesRealEngineFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModulesRealEngineFirst(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):   # the order a worker reports is the order units are handed out
        items.sort(key=lambda item: work_unit(item.nodeid) != REAL_ENGINE_GROUP)   # stable
