"""Getting a Ray cluster: the user's (`--ray-address` / `RAY_ADDRESS`), or one started here.

With the simulated engine the local cluster has one Ray node per GPU type of the matrix, each
advertising that type's fake GPUs (`num_gpus = count`) and its `accelerator_type:<ray_label>`
resource, exactly as a real GPU node does, so the same placement code runs on a laptop as on the
fleet. With the real engine and no address, Ray starts on this machine and detects its GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from soakmatrix.matrix.logger_level import logger_level
from soakmatrix.matrix.spec import GpuType

from .placement import ACCELERATOR_PREFIX

ADDRESS_ENV = "RAY_ADDRESS"
KEEP_RUNTIME_ENVS_ENV = "SOAKMATRIX_KEEP_RUNTIME_ENVS"
T = TypeVar("T")


@dataclass(frozen=True)
class NodeShape:
    """One node of a local cluster: its fake GPUs and custom resources."""

    num_gpus: int
    resources: Mapping[str, float] = field(default_factory=dict)
    num_cpus: int = 1


def address_from(cli_address: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """`--ray-address` wins over `RAY_ADDRESS`; neither means a local cluster."""
    return cli_address or environ.get(ADDRESS_ENV) or None


def sim_fleet(gpus: Mapping[str, GpuType], nodes_per_type: int = 1, cpus_per_node: int = 1) -> list[NodeShape]:
    """The local cluster for the simulated engine: per GPU type, nodes with its count of fake GPUs.

    Two matrix GPU types sharing a Ray label share nodes (Ray cannot tell them apart either).
    """
    by_label: dict[str, int] = {}
    for gpu in gpus.values():
        by_label[gpu.ray_label] = max(by_label.get(gpu.ray_label, 0), gpu.count)
    return [
        NodeShape(count, {ACCELERATOR_PREFIX + label: 1.0}, cpus_per_node)
        for label, count in sorted(by_label.items())
        for _ in range(nodes_per_type)
    ]


def gcs_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of a plain `host:port` GCS address; None for `auto`, `ray://...`, `local`."""
    if "://" in address or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    return (host, int(port)) if port.isdigit() and host else None


def client_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray Client address `ray://host:port`; None for anything else."""
    if not address.startswith("ray://"):
        return None
    return gcs_endpoint(address[len("ray://") :].split("/", 1)[0])


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast on an address nothing listens on: Ray itself retries such a GCS for ever, and a Ray
    Client for 30 s before it says so."""
    endpoint = gcs_endpoint(address) or client_endpoint(address)
    if endpoint is None:
        return
    import socket

    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc.strerror or exc})") from exc


# what `connect` raises for a cluster it cannot use (a command says `cannot_reach`, no traceback)
CONNECT_ERRORS = (ConnectionError, RuntimeError, TimeoutError, ValueError)
CLIENT_SESSION_ATTEMPTS = 3


def cannot_reach(address: str | None, exc: BaseException) -> str:
    """What a command says when `connect` raised one of `CONNECT_ERRORS`."""
    return f"cannot reach Ray{' at ' + address if address else ''}: {type(exc).__name__}: {exc}"


def client_session_failed(exc: BaseException) -> bool:
    """The Ray Client server answered but could not start this driver's session: it forks a server
    per driver, and that start can fail once and succeed when asked again. Any other error (a refused
    connection, a version mismatch) is not worth asking again."""
    return isinstance(exc, ConnectionAbortedError) and "Initialization failure from server" in str(exc)


def retry_client_session(
    init: Callable[[], T],
    address: str,
    attempts: int = CLIENT_SESSION_ATTEMPTS,
    pause: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> T:
    """`init()` (a Ray Client connection, which disconnects when it raises), asked again after a failed
    session start, up to `attempts` times in all; the last failure is raised as it came."""
    for attempt in range(1, attempts):
        try:
            return init()
        except Exception as exc:  # `client_session_failed` decides
            if not client_session_failed(exc):
                raise
            say(
                f"soakmatrix: the Ray Client server at {address} could not start a session "
                f"(attempt {attempt} of {attempts}); asking again"
            )
            pause(2.0 * attempt)
    return init()


class ClusterHandle:
    """A connected Ray session; `close()` disconnects and stops what this process started."""

    def __init__(self, description: str, shutdown: Callable[[], None]):
        self.description = description
        self._shutdown: Callable[[], None] | None = shutdown

    def close(self) -> None:
        shutdown, self._shutdown = self._shutdown, None
        if shutdown is not None:
            shutdown()

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only() -> None:
    """Make a cluster started on this machine talk over 127.0.0.1 only.

    Ray otherwise advertises the machine's network address for its GCS and raylets; a one-machine
    cluster has no use for the network. Ray's switch for this is the flag it uses on laptops (with it
    off, `get_node_ip_address` answers the loopback address); the environment carries it to the
    processes Ray starts, the module attribute to this already-imported one.
    """
    os.environ[LOOPBACK_ENV] = "0"
    try:
        import ray._private.ray_constants as ray_constants
    except ImportError:  # a private API: the processes Ray starts still read the environment
        return
    ray_constants.ENABLE_RAY_CLUSTER = False


def connect(
    address: str | None, *, backend: str, gpus: Mapping[str, GpuType], runtime_env: Mapping[str, Any] | None = None
) -> ClusterHandle:
    """Connect to `address`, or start a local cluster (fake GPU nodes for the sim backend)."""
    from soakmatrix.matrix.extras import require

    require("ray")  # an install without the extra: a line saying what to install, not a traceback
    import ray

    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING, "include_dashboard": False}
    if address:
        check_reachable(address)

        def init() -> None:
            ray.init(
                address=address,
                runtime_env=dict(runtime_env) if runtime_env else None,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )

        if client_endpoint(address):
            retry_client_session(init, address)
        else:
            init()
        return ClusterHandle(f"Ray cluster at {address}", ray.shutdown)
    if backend != "sim":
        # "local" always starts a fresh cluster: a bare init() would join whatever Ray already runs here
        loopback_only()
        ray.init(address="local", **quiet)
        session = session_dir()
        return ClusterHandle("local Ray (this machine's GPUs)", lambda: _shutdown_local(ray.shutdown, session))
    return start_local(sim_fleet(gpus))


def session_dir() -> Path | None:
    """The Ray session folder of the cluster this process is connected to (None when unknown)."""
    try:
        import ray._private.worker as worker

        node = worker.global_worker.node
        return Path(node.get_session_dir_path()) if node is not None else None
    except Exception:  # noqa: BLE001 - a private API: without it nothing is removed, nothing breaks
        return None


def drop_runtime_resources(session: Path | None) -> None:
    """Remove what Ray set up for the runtime_envs of a cluster this process started and stopped.

    A `pip:` build is a virtualenv that clones the driver's environment (3.5 GB beside vLLM's CPU
    build), and Ray never deletes a session's folder: a machine that runs the nightly on a local
    cluster, or the tests, filled its disk that way. The cluster is gone, so nothing can use them; the
    session's logs (small) stay for whoever debugs it. `SOAKMATRIX_KEEP_RUNTIME_ENVS=1` keeps them too
    (to look inside a build's environment after the run).
    """
    if os.environ.get(KEEP_RUNTIME_ENVS_ENV, "") not in ("", "0"):
        return
    if session is not None and session.name.startswith("session_"):
        shutil.rmtree(session / "runtime_resources", ignore_errors=True)


def _shutdown_local(stop: Callable[[], None], session: Path | None) -> None:
    try:
        stop()
    finally:
        drop_runtime_resources(session)


# A head node's dashboard agent listens on Ray's fixed 52365 unless told otherwise (worker nodes get
# a free port): a second cluster on the same machine (two runs on one CI runner, two test workers) then
# has a head agent without HTTP (no job or state API for that node). None lets the agent bind a free
# port and publish it.
HEAD_PORTS: dict[str, Any] = {"dashboard_agent_listen_port": None}


def start_local(shapes: list[NodeShape], attempts: int = 3) -> ClusterHandle:
    """A multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`), this process its driver.

    On a loaded machine a raylet can miss Ray's fixed 30 s registration window; the processes of a
    failed start are stopped (only this process's own new children) and the start is tried again.
    """
    if not shapes:
        raise ValueError("a local cluster needs at least one node")
    return retry_start(lambda: _start_local_once(shapes), attempts)


def retry_start(start: Callable[[], T], attempts: int = 3, what: str = "the local Ray cluster") -> T:
    """`start()` (a local Ray cluster's start, which must shut down what it started when it raises),
    tried up to `attempts` times; after each failure the processes this process started during it
    (a half-started GCS or raylet) are stopped. Also used by the tests' `ray.cluster_utils` clusters."""
    failure: BaseException | None = None
    for _ in range(attempts):
        before = _own_children()
        try:
            return start()
        except Exception as exc:  # noqa: BLE001 - Ray raises plain Exception on a slow start
            failure = exc
            _stop_new_children(before)
    raise RuntimeError(f"{what} did not start in {attempts} attempts: {failure}") from failure


def _start_local_once(shapes: list[NodeShape]) -> ClusterHandle:
    import ray
    from ray.cluster_utils import Cluster

    head, *rest = shapes
    loopback_only()
    cluster = Cluster(initialize_head=False)
    address_file = machine_address_file()
    try:
        with address_left_alone(address_file, lambda: cluster.address):
            cluster.add_node(
                num_cpus=head.num_cpus,
                num_gpus=head.num_gpus,
                resources=dict(head.resources),
                include_dashboard=False,
                **HEAD_PORTS,
            )
        for shape in rest:
            cluster.add_node(num_cpus=shape.num_cpus, num_gpus=shape.num_gpus, resources=dict(shape.resources))
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        cluster.wait_for_nodes()
    except BaseException:
        if ray.is_initialized():
            ray.shutdown()
        _shutdown_cluster(cluster, address_file)
        raise

    session = session_dir()

    def stop() -> None:
        ray.shutdown()
        _shutdown_cluster(cluster, address_file)

    labels = ", ".join(
        f"{s.num_gpus} x {next(iter(s.resources), '?').removeprefix(ACCELERATOR_PREFIX)}" for s in shapes
    )
    return ClusterHandle(
        f"local Ray cluster, {len(shapes)} node(s) with simulated GPUs: {labels}",
        lambda: _shutdown_local(stop, session),
    )


def _shutdown_cluster(cluster: Any, address_file: Path | None) -> None:
    ours = cluster.address  # None once the head is gone
    with address_left_alone(address_file, lambda: ours):
        cluster.shutdown()


def machine_address_file() -> Path | None:
    """The file in which `ray start` leaves its cluster's address for this machine
    (`/tmp/ray/ray_current_cluster`, under `RAY_TMPDIR` when set); None where Ray has no such API."""
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:  # a private API: without it the file is left as Ray leaves it
        return None
    return Path(get_ray_address_file(None))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


@contextlib.contextmanager
def address_left_alone(path: Path | None, ours: Callable[[], str | None]):
    """Undo what the block did to the machine's Ray address file, and only that.

    `ray.cluster_utils` writes its head's address there when the head starts and deletes the file
    when the cluster stops, whatever it then holds. On a GPU machine that also runs a `ray start`
    cluster, `ray.init(address="auto")` and `ray job submit` would join our cluster while it runs
    and find no cluster once it stopped. So the file is put back as it was before the block when it
    now holds `ours()` (our cluster's address) or is gone; an address some other cluster wrote
    meanwhile stays.
    """
    before = _read(path) if path is not None else None
    # Ray's note that "ray.init() on this node will now connect to the new instance" is not true
    try:
        with logger_level("ray._private.utils", logging.WARNING):
            yield
    finally:
        if path is not None:
            _put_back(path, before, ours())


def _put_back(path: Path, before: str | None, ours: str | None) -> None:
    now = _read(path)
    if now == before or (now is not None and now != ours):
        return
    if before is None or before == ours:
        path.unlink(missing_ok=True)
        return
    # written whole or not at all: a `ray job submit` may read it at any moment
    spare = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        spare.write_text(before)
        os.replace(spare, path)
    except OSError:
        spare.unlink(missing_ok=True)


def _own_children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_new_children(before: set[int], timeout_s: float = 10.0) -> None:
    """Stop the processes this process started since `before` (a half-started Ray node)."""
    import psutil

    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in new:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(new, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
