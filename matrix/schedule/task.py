"""What runs inside one cell's Ray task, on the node Ray chose: the node's preflight (once per node
per run, `preflight.py`), then the soak job under its hard cap, with the GPUs Ray assigned,
reporting where and when it began, its engine owned by the worker's reaper (`jobs/reaper.py`) so
that no engine outlives a worker killed mid-cell.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.result import CellResult

from . import preflight
from .loop import STOP_GRACE_S, infra_result

RunCell = Callable[..., CellResult]
PREFLIGHT_TIMEOUT_S = 300.0  # the doctor's slowest probe (vLLM's import) has 180 s of its own
MAILBOX_TIMEOUT_S = 30.0


def run_with_cap(
    run_cell: RunCell,
    spec: SoakSpec,
    cap_s: float,
    *,
    grace_s: float = STOP_GRACE_S,
    on_event: Callable[[Any], None] | None = None,
    poll_s: float = 0.5,
) -> CellResult:
    """Run one cell in a thread, stopping it at the hard cap (-> infra_error).

    A KeyboardInterrupt in the calling thread (Ray's `cancel` of a running task raises one) sets
    the stop event and waits for `run_cell` to tear its server down before re-raising: cancelling
    never leaves a server behind. Waits in short slices because an interrupt is only delivered
    while Python code runs.
    """
    stop = threading.Event()
    finished = threading.Event()  # not Thread.join: an interrupted join can mark a live thread dead
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
        except KeyboardInterrupt:  # a second cancel: keep waiting for the teardown
            continue


def with_assigned_gpus(spec: SoakSpec, gpu_ids: Sequence[Any]) -> SoakSpec:
    """The real engine sees exactly the GPUs Ray assigned; the simulated one needs none."""
    if spec.backend != "vllm" or not gpu_ids:
        return spec
    return replace(spec, env={**spec.env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)})


_worker_reaper: Any = None  # this Ray worker's watcher; a worker runs many soak jobs in turn


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


def checked_node(
    spec: SoakSpec,
    ray_label: str,
    node: str,
    mailbox: Any,
    diagnose: preflight.Diagnose,
    gpu_ids: Sequence[Any],
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
    get: Callable[..., Any] | None = None,
) -> tuple[dict, CellResult | None]:
    """(the node's preflight report, the cell's infra_error when the node failed it). The report is
    the run's cached one for this node (`get`: ray.get), else the doctor's, run here under
    `timeout_s` (a wedged GPU can stall NVML: a preflight that does not finish refuses the cell, it
    does not hang it)."""
    if get is None:
        import ray

        get = ray.get
    key = preflight.cache_key(node, spec)
    try:
        cached = get(mailbox.preflight.remote(key), timeout=MAILBOX_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the cache is an optimisation: run the doctor
        cached = None
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["report"], box["new"] = preflight.node_report(spec, ray_label, cached, diagnose, gpu_ids)
        except BaseException as exc:  # noqa: BLE001 - a doctor that breaks refuses the cell, with why
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="preflight", daemon=True).start()
    _wait(done, timeout_s, 0.5)
    if not done.is_set() or "error" in box:
        why = (
            f"did not finish in {timeout_s:.0f} s"
            if not done.is_set()
            else f"failed: {type(box['error']).__name__}: {box['error']}"
        )
        report = {
            "node": node,
            "backend": spec.backend,
            "ok": False,
            "notes": [],
            "checks": [{"name": "doctor", "status": "fail", "detail": f"the preflight {why}"}],
        }
        return report, preflight.refusal(spec, report, node)
    report = box["report"]
    if box.get("new"):
        mailbox.remember_preflight.remote(key, report)
    return report, preflight.refusal(spec, report, node)


def soak_task(
    spec: SoakSpec,
    mailbox: Any,
    cap_s: float,
    run_cell: RunCell | None,
    ray_label: str = "",
    diagnose: preflight.Diagnose | None = None,
) -> dict:
    """The Ray task body: runs on the node Ray chose, with the GPUs Ray assigned; the node's
    preflight first (`diagnose`: None runs none)."""
    import ray

    if run_cell is None:
        from soakmatrix.jobs.soak import run_cell as soak_run_cell

        run_cell = soak_run_cell
    node = ray.get_runtime_context().get_node_id()
    mailbox.post.remote((spec.cell_id, spec.attempt, node, time.time()))
    report = None
    if diagnose is not None:
        report, refused = checked_node(spec, ray_label, node, mailbox, diagnose, ray.get_gpu_ids())
        if refused is not None:
            refused.ray_node_id = node
            return refused.to_dict()
    spec = owned_by_this_worker(with_assigned_gpus(spec, ray.get_gpu_ids()))
    result = run_with_cap(run_cell, spec, cap_s)
    if report is not None:
        result.preflight = dict(report)
    result.ray_node_id = node
    if spec.build:
        result.build, result.build_ordinal = spec.build, spec.build_ordinal
    if not result.node:
        result.node = node
    return result.to_dict()
