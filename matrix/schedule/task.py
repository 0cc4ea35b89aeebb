"""What runs inside one cell's Ray task, on the node Ray chose: the soak job under its hard cap,
with the GPUs Ray assigned, reporting where and when it began, its engine owned by the worker's
reaper (`jobs/reaper.py`) so that no engine outlives a worker killed mid-cell.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.result import CellResult

from .loop import STOP_GRACE_S, infra_result

RunCell = Callable[..., CellResult]


def run_with_cap(run_cell: RunCell, spec: SoakSpec, cap_s: float, *, grace_s: float = STOP_GRACE_S,
                 on_event: Callable[[Any], None] | None = None, poll_s: float = 0.5) -> CellResult:
    """Run one cell in a thread, stopping it at the hard cap (-> infra_error).

    A KeyboardInterrupt in the calling thread (Ray's `cancel` of a running task raises one) sets
    the stop event and waits for `run_cell` to tear its server down before re-raising: cancelling
    never leaves a server behind. Waits in short slices because an interrupt is only delivered
    while Python code runs.
    """
    stop = threading.Event()
    finished = threading.Event()   # not Thread.join: an interrupted join can mark a live thread dead
    box: dict[str, Any] = {}
    started = time.time()

    def target() -> None:
        try:
            box["result"] = run_cell(spec, stop=stop, on_event=on_event)
        except BaseException as exc:  # noqa: BLE001 - reported to the driver as an infra error
            box["error"] = exc
        finally:
            finished.set()

    worker = threading.Thread(target=target, name=f"soak-{spec.cell_id}", daemon=True)
    try:
        # started inside the try: an interrupt can land while start() waits for the thread, which
        # by then runs the cell (a busy machine makes that wait long)
        worker.start()
        while not finished.is_set() and time.time() - started < cap_s:
            finished.wait(poll_s)
    except KeyboardInterrupt:
        stop.set()
        _wait(finished, grace_s, poll_s)
        raise
    if not finished.is_set():
        stop.set()
        _wait(finished, grace_s, poll_s)
        return infra_result(spec, f"overran its hard cap of {cap_s:.0f} s; stopped", started_at=started)
    if "error" in box:
        exc = box["error"]
        return infra_result(spec, f"the soak job failed: {type(exc).__name__}: {exc}", started_at=started)
    return box["result"]


def _wait(finished: threading.Event, timeout_s: float, poll_s: float) -> None:
    deadline = time.time() + timeout_s
    while not finished.is_set() and time.time() < deadline:
        try:
            finished.wait(poll_s)
        except KeyboardInterrupt:   # a second cancel: keep waiting for the teardown
            continue


def with_assigned_gpus(spec: SoakSpec, gpu_ids: Sequence[Any]) -> SoakSpec:
    """The real engine sees exactly the GPUs Ray assigned; the simulated one needs none."""
    if spec.backend != "vllm" or not gpu_ids:
        return spec
    return replace(spec, env={**spec.env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)})


_worker_reaper: Any = None   # this Ray worker's watcher; a worker runs many soak jobs in turn


def owned_by_this_worker(spec: SoakSpec) -> SoakSpec:
    """`spec` with its engine marked as this worker's (the reaper's token in its env): if the worker
    dies mid-cell, even by SIGKILL, the reaper stops the engine's whole tree. A reaper that cannot
    start leaves the spec as it was: the soak job still tears its engine down itself."""
    global _worker_reaper
    from soakmatrix.jobs.reaper import Reaper

    try:
        if _worker_reaper is None:
            _worker_reaper = Reaper()
        _worker_reaper.ensure()
    except OSError:
        return spec
    return replace(spec, env={**spec.env, **_worker_reaper.env})


def soak_task(spec: SoakSpec, mailbox: Any, cap_s: float, run_cell: RunCell | None) -> dict:
    """The Ray task body: runs on the node Ray chose, with the GPUs Ray assigned."""
    import ray

    if run_cell is None:
        from soakmatrix.jobs.soak import run_cell
    node = ray.get_runtime_context().get_node_id()
    mailbox.post.remote((spec.cell_id, spec.attempt, node, time.time()))
    spec = owned_by_this_worker(with_assigned_gpus(spec, ray.get_gpu_ids()))
    result = run_with_cap(run_cell, spec, cap_s)
    result.extra["ray_node_id"] = node
    if spec.build:
        result.build, result.build_ordinal = spec.build, spec.build_ordinal
    if not result.node:
        result.node = node
    return result.to_dict()
