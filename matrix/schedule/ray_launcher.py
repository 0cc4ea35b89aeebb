"""The Launcher on a connected Ray cluster, and the mailbox actor its tasks report their start to.

A cell with an engine build runs its task in the build's runtime_env (`runtime_envs`); a build Ray
cannot set up comes back as that cell's config_error or infra_error, never as a task that waits."""

from __future__ import annotations

import socket
import time
from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.result import CellResult

from .cluster import gcs_endpoint
from .cluster_loss import HeadUnreachable
from .placement import Node, avoid_selector, nodes_from_ray
from .preflight import Diagnose, doctor
from .runtime_envs import (
    interpreter_of,
    interpreter_present,
    missing_interpreter_result,
    runtime_env_option,
    setup_failure_result,
)
from .task import RunCell, soak_task

INTERPRETER_CHECK_S = 60.0
HEAD_CHECK_EVERY_S = 5.0  # how often the loop's polling also checks that the head's GCS still listens
HEAD_CHECK_TIMEOUT_S = 5.0


class RayLauncher:
    """Launcher on a connected Ray cluster: one task per cell asking `num_gpus=TP` and the GPU
    type's `accelerator_type`, no Ray-level retries (the loop decides), a retry avoiding the
    nodes that failed it, and a mailbox actor through which tasks say where and when they began."""

    def __init__(
        self, run_cell: RunCell | None = None, cpus_per_cell: float = 0.0, diagnose: Diagnose | str | None = "default"
    ):
        """`diagnose`: the node preflight each cell's task runs first (None: none). By default the real
        doctor, except for a launcher given its own `run_cell` (tests, benchmarks with fake GPUs)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        # on the driver's node: a GPU node may be lost, the driver's node is the run's lifetime anyway
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # an actor handle (its methods are called as `.drain.remote()`), which Ray's types do not model
        self._mailbox: Any = ray.remote(num_cpus=0)(_Mailbox).options(scheduling_strategy=here).remote()
        self._task = ray.remote(soak_task)
        self._run_cell = run_cell
        self._diagnose = (doctor if run_cell is None else None) if diagnose == "default" else diagnose
        self._cpus = cpus_per_cell
        self._specs: dict[Any, SoakSpec] = {}
        self._has_interpreter: dict[tuple[str, str], bool] = {}  # (node, executable) -> present
        self._gcs = _gcs_of(ray)
        self._head_checked_at = 0.0

    def submit(self, spec: SoakSpec, ray_label: str, avoid_nodes: frozenset[str], cap_s: float) -> Any:
        options: dict[str, Any] = {
            "num_gpus": spec.gpu_count,
            "accelerator_type": ray_label,
            "max_retries": 0,
            "retry_exceptions": False,
            "num_cpus": self._cpus,
            "name": f"soak:{spec.cell_name}"[:200],
            **runtime_env_option(spec),
        }
        executable = interpreter_of(spec.runtime_env)
        if executable:
            hosts = [
                n.node_id for n in self.nodes() if n.alive and ray_label in n.accelerators and n.gpus >= spec.gpu_count
            ]
            lacking = frozenset(n for n in hosts if not self._interpreter_on(n, executable))
            if hosts and len(lacking) == len(hosts):
                return _Ready(missing_interpreter_result(spec, executable, len(hosts)))
            avoid_nodes = avoid_nodes | lacking
        if avoid_nodes:
            options["label_selector"] = avoid_selector(avoid_nodes)
        handle = self._task.options(**options).remote(
            spec, self._mailbox, cap_s, self._run_cell, ray_label, self._diagnose
        )
        self._specs[handle] = spec
        return handle

    def _interpreter_on(self, node: str, executable: str) -> bool:
        """Whether `executable` exists on `node` (asked once per node; unknown counts as present)."""
        key = (node, executable)
        if key not in self._has_interpreter:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            probe = (
                self._ray.remote(num_cpus=0, max_retries=0)(interpreter_present)
                .options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(executable)
            )
            try:
                self._has_interpreter[key] = bool(self._ray.get(probe, timeout=INTERPRETER_CHECK_S))
            except Exception:  # noqa: BLE001 - a node too busy or gone: let Ray try it
                return True
        return self._has_interpreter[key]

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        ready = [h for h in handles if isinstance(h, _Ready)]
        pending = [h for h in handles if not isinstance(h, _Ready)]
        if ready or not pending:
            return ready
        done, _ = self._ray.wait(pending, num_returns=len(pending), timeout=timeout_s, fetch_local=False)
        return done

    def result(self, handle: Any) -> CellResult:
        if isinstance(handle, _Ready):
            return handle.result
        from ray.exceptions import RuntimeEnvSetupError

        spec = self._specs.pop(handle, None)
        try:
            value = self._ray.get(handle)
        except RuntimeEnvSetupError as exc:
            if spec is None:
                raise
            return setup_failure_result(spec, str(exc))
        return value if isinstance(value, CellResult) else CellResult.from_dict(value)

    def cancel(self, handle: Any, force: bool) -> None:
        if isinstance(handle, _Ready):
            return
        try:
            self._ray.cancel(handle, force=force)
        except Exception:  # noqa: BLE001 - already finished or its node is gone
            pass

    def nodes(self) -> list[Node]:
        self._check_head()
        return nodes_from_ray(self._ray.nodes())

    def started(self) -> list[tuple[str, int, str, float]]:
        """The mailbox's news; an unavailable mailbox (its node, the driver's, is gone) raises."""
        if time.monotonic() - self._head_checked_at >= HEAD_CHECK_EVERY_S:
            self._check_head()
        return self._ray.get(self._mailbox.drain.remote())

    def _check_head(self) -> None:
        """Raise `HeadUnreachable` when nothing listens at the head's GCS address: `ray.nodes()` would
        wait for the GCS until Ray ends the whole process, with no chance to write what finished."""
        self._head_checked_at = time.monotonic()
        if self._gcs is None:
            return
        try:
            socket.create_connection(self._gcs, timeout=HEAD_CHECK_TIMEOUT_S).close()
        except OSError as exc:
            host, port = self._gcs
            raise HeadUnreachable(f"nothing answers at its GCS address {host}:{port}: {exc.strerror or exc}") from exc


def _gcs_of(ray: Any) -> tuple[str, int] | None:
    """(host, port) of the connected cluster's GCS; None for a Ray Client driver (outside the cluster,
    the GCS address may not be reachable at all; its connection's own errors tell a lost head)."""
    try:
        from ray.util.client import ray as client

        if client.is_connected():
            return None
        return gcs_endpoint(str(ray.get_runtime_context().gcs_address))
    except Exception:  # noqa: BLE001 - without it the head is not checked; Ray's own errors still tell
        return None


class _Ready:
    """A handle whose result is known without a task (the build cannot start anywhere)."""

    def __init__(self, result: CellResult) -> None:
        self.result = result


class _Mailbox:
    """A tiny actor: tasks post (cell id, attempt, node, time) when they begin; the driver drains.
    It also keeps each node's preflight report for the run, so a node is checked once."""

    def __init__(self) -> None:
        self._items: list[tuple[str, int, str, float]] = []
        self._preflights: dict[str, dict] = {}  # the run's node preflight reports (preflight.cache_key)

    def post(self, item: tuple[str, int, str, float]) -> None:
        self._items.append(item)

    def drain(self) -> list[tuple[str, int, str, float]]:
        items, self._items = self._items, []
        return items

    def preflight(self, key: str) -> dict | None:
        return self._preflights.get(key)

    def remember_preflight(self, key: str, report: dict) -> None:
        self._preflights.setdefault(key, report)
