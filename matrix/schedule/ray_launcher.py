"""The Launcher on a connected Ray cluster, and the mailbox actor its tasks report their start to."""

from __future__ import annotations

from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.result import CellResult

from .placement import Node, avoid_selector, nodes_from_ray
from .task import RunCell, soak_task


class RayLauncher:
    """Launcher on a connected Ray cluster: one task per cell asking `num_gpus=TP` and the GPU
    type's `accelerator_type`, no Ray-level retries (the loop decides), a retry avoiding the
    nodes that failed it, and a mailbox actor through which tasks say where and when they began."""

    def __init__(self, run_cell: RunCell | None = None, cpus_per_cell: float = 0.0):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        # on the driver's node: a GPU node may be lost, the driver's node is the run's lifetime anyway
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._mailbox = ray.remote(num_cpus=0)(_Mailbox).options(scheduling_strategy=here).remote()
        self._task = ray.remote(soak_task)
        self._run_cell = run_cell
        self._cpus = cpus_per_cell

    def submit(self, spec: SoakSpec, ray_label: str, avoid_nodes: frozenset[str], cap_s: float) -> Any:
        options: dict[str, Any] = {"num_gpus": spec.gpu_count, "accelerator_type": ray_label,
                                   "max_retries": 0, "retry_exceptions": False,
                                   "num_cpus": self._cpus, "name": f"soak:{spec.cell_name}"[:200]}
        if avoid_nodes:
            options["label_selector"] = avoid_selector(avoid_nodes)
        return self._task.options(**options).remote(spec, self._mailbox, cap_s, self._run_cell)

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        if not handles:
            return []
        ready, _ = self._ray.wait(handles, num_returns=len(handles), timeout=timeout_s, fetch_local=False)
        return ready

    def result(self, handle: Any) -> CellResult:
        value = self._ray.get(handle)
        return value if isinstance(value, CellResult) else CellResult.from_dict(value)

    def cancel(self, handle: Any, force: bool) -> None:
        try:
            self._ray.cancel(handle, force=force)
        except Exception:  # noqa: BLE001 - already finished or its node is gone
            pass

    def nodes(self) -> list[Node]:
        return nodes_from_ray(self._ray.nodes())

    def started(self) -> list[tuple[str, int, str, float]]:
        return self._ray.get(self._mailbox.drain.remote())


class _Mailbox:
    """A tiny actor: tasks post (cell id, attempt, node, time) when they begin; the driver drains."""

    def __init__(self) -> None:
        self._items: list[tuple[str, int, str, float]] = []

    def post(self, item: tuple[str, int, str, float]) -> None:
        self._items.append(item)

    def drain(self) -> list[tuple[str, int, str, float]]:
        items, self._items = self._items, []
        return items
