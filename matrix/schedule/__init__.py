"""Scheduling a matrix on Ray: one task per cell on a node with the right GPU type and count.

The decisions are pure functions over plain data (`Node`, `PlannedCell`, `CellResult`): which cells
no node can host, in which order to submit, whether a result is retried, when a cell overran its
cap. `run_cells` is the loop that applies them; its side effects go through a `Launcher`
(`RayLauncher` below: tasks, cancellation, the start-event mailbox), so the loop is tested with a
fake launcher and no Ray at all.

Outcomes (as Ray's release tooling splits them): a lost node, a killed worker, a task that overran
its hard cap or an error inside the soak job is an `infra_error`, retried on another node up to the
profile's `retries`; a hang or crash is the finding and never retried.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.plan import PlannedCell

ACCELERATOR_PREFIX = "accelerator_type:"
NODE_ID_LABEL = "ray.io/node-id"
STOP_GRACE_S = 60.0      # a cancelled cell gets this long to tear its server down
DEFAULT_CAP_MARGIN_S = 600.0


# -- pure decisions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """What placement needs to know about one Ray node."""

    node_id: str
    gpus: float
    accelerators: frozenset[str]   # accelerator_type labels it offers
    alive: bool = True


def nodes_from_ray(ray_nodes: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Turn `ray.nodes()` into `Node`s (dead nodes kept, marked)."""
    out = []
    for n in ray_nodes:
        resources = n.get("Resources") or {}
        labels = frozenset(k[len(ACCELERATOR_PREFIX):] for k in resources if k.startswith(ACCELERATOR_PREFIX))
        out.append(Node(str(n.get("NodeID", "")), float(resources.get("GPU", 0)), labels, bool(n.get("Alive", True))))
    return out


def placement_problem(pc: PlannedCell, nodes: Sequence[Node]) -> str | None:
    """Why no live node can ever host this cell, or None if one can."""
    live = [n for n in nodes if n.alive]
    typed = [n for n in live if pc.ray_label in n.accelerators]
    if not typed:
        offered = sorted({a for n in live for a in n.accelerators})
        return (f"no node offers accelerator_type:{pc.ray_label} ({pc.cell.gpu}); "
                f"the cluster offers: {', '.join(offered) or 'no labelled GPUs'}")
    if not any(n.gpus >= pc.gpu_count for n in typed):
        most = max(n.gpus for n in typed)
        return (f"needs {pc.gpu_count} {pc.ray_label} GPUs on one node; the largest such node has {most:g}")
    return None


def unplaceable(cells: Sequence[PlannedCell], nodes: Sequence[Node]) -> dict[str, str]:
    """cell id -> why no node can host it: reported up front instead of pending forever."""
    return {pc.id: reason for pc in cells if (reason := placement_problem(pc, nodes))}


def dispatch_order(cells: Sequence[PlannedCell]) -> list[PlannedCell]:
    """Largest first (GPUs per cell, then GPU-hours): big cells packed early leave the small ones
    to fill the gaps at the end, which keeps the makespan near its lower bound (LPT)."""
    return sorted(cells, key=lambda pc: (-pc.gpu_count, -pc.gpu_hours))


def avoid_on_retry(pc: PlannedCell, failed_on: Iterable[str], nodes: Sequence[Node]) -> frozenset[str]:
    """Nodes a retry must not use: those the cell failed on, as long as another live node can
    still host it (with the only suitable node excluded the retry would wait forever)."""
    failed = frozenset(n for n in failed_on if n)
    hosts = [n for n in nodes if n.alive and pc.ray_label in n.accelerators and n.gpus >= pc.gpu_count]
    if any(n.node_id not in failed for n in hosts):
        return frozenset(n.node_id for n in hosts if n.node_id in failed)
    return frozenset()


def avoid_selector(avoid: Iterable[str]) -> dict[str, str]:
    """Ray's label selector for "not on these nodes" (every node carries its id as a label)."""
    ids = sorted(avoid)
    if not ids:
        return {}
    return {NODE_ID_LABEL: "!" + ids[0] if len(ids) == 1 else "!in(" + ",".join(ids) + ")"}


def should_retry(result: CellResult, retries_allowed: int) -> bool:
    """Only infra errors are retried, and only `retries_allowed` times (attempt counts from 1)."""
    return result.outcome.retryable and result.attempt <= retries_allowed


def cap_seconds(soak_s: float, startup_timeout_s: float, cap_s: float | None, time_scale: float = 1.0) -> float:
    """The hard cap per cell in wall seconds: the profile's `cap`, else soak + start-up timeout +
    10 minutes. Matrix durations are engine time; the simulated engine runs `time_scale` times
    faster than the wall clock, its start-up does not."""
    scale = time_scale if time_scale > 0 else 1.0
    if cap_s is not None:
        return cap_s / scale
    return soak_s / scale + startup_timeout_s + DEFAULT_CAP_MARGIN_S


def overran(started_at: float | None, now: float, cap_s: float, grace_s: float) -> bool:
    """The driver's backstop: the task itself stops at the cap; past cap + grace it is killed."""
    return started_at is not None and now - started_at > cap_s + grace_s


def stranded(waiting: Sequence[PlannedCell], nodes: Sequence[Node]) -> dict[str, str]:
    """Waiting cells that no live node can host any more (their GPU type's nodes were lost)."""
    return unplaceable(waiting, nodes)


def lower_bound_makespan(cells: Sequence[PlannedCell], gpus_by_label: Mapping[str, float],
                         duration: Callable[[PlannedCell], float] | None = None) -> float:
    """max over GPU types of (GPU-seconds of that type / GPUs of that type): no schedule beats it."""
    duration = duration or (lambda pc: pc.soak_s + pc.startup_s)
    work: dict[str, float] = {}
    for pc in cells:
        work[pc.ray_label] = work.get(pc.ray_label, 0.0) + pc.gpu_count * duration(pc)
    return max((w / gpus_by_label[label] for label, w in work.items() if gpus_by_label.get(label)), default=0.0)


def infra_result(spec: SoakSpec, message: str, *, node: str = "", started_at: float | None = None,
                 retries: Sequence[str] = ()) -> CellResult:
    """A result for a cell that produced none itself (node lost, worker killed, never placed)."""
    now = time.time()
    return CellResult(
        cell_id=spec.cell_id, cell_name=spec.cell_name, outcome=Outcome.INFRA_ERROR, model=spec.model,
        gpu_type=spec.gpu_type, workload=spec.workload.name, flags=dict(spec.flags), message=message,
        node=node, gpu_count=spec.gpu_count, engine=spec.backend, started_at=started_at or now, ended_at=now,
        attempt=spec.attempt, retries=list(retries))


# -- inside the Ray task ------------------------------------------------------------------------------

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

    threading.Thread(target=target, name=f"soak-{spec.cell_id}", daemon=True).start()
    try:
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


# -- the loop -------------------------------------------------------------------------------------------

class Launcher(Protocol):
    """The side effects of scheduling (Ray in production, a fake in tests)."""

    def submit(self, spec: SoakSpec, ray_label: str, avoid_nodes: frozenset[str], cap_s: float) -> Any:
        """Start the cell's task; returns a handle."""
        ...

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        """The handles that have finished (within timeout_s)."""
        ...

    def result(self, handle: Any) -> CellResult:
        """The finished task's CellResult; a lost node or killed worker raises."""
        ...

    def cancel(self, handle: Any, force: bool) -> None:
        ...

    def nodes(self) -> list[Node]:
        """The cluster's nodes now (for up-front placement checks and retries)."""
        ...

    def started(self) -> list[tuple[str, int, str, float]]:
        """(cell id, attempt, node id, time) of tasks that began since the last call."""
        ...


@dataclass
class Running:
    pc: PlannedCell
    spec: SoakSpec
    failed_on: frozenset[str]
    node: str = ""
    started_at: float | None = None
    killed_for_cap: bool = False
    retries: list[str] = field(default_factory=list)
    stranded_since: float | None = None   # first seen waiting with no live node able to host it
    never_placed: str | None = None       # why it was given up on while waiting


@dataclass
class RunSummary:
    results: list[CellResult]
    interrupted: bool = False
    stopped_early: bool = False    # --fail-fast found something and cancelled the rest
    unfinished: list[str] = field(default_factory=list)


class Events(Protocol):
    """What the loop reports; the progress display and the result writers listen."""

    def cell_started(self, pc: PlannedCell, attempt: int, node: str) -> None: ...
    def cell_retrying(self, pc: PlannedCell, result: CellResult) -> None: ...
    def cell_finished(self, pc: PlannedCell, result: CellResult) -> None: ...
    def tick(self) -> None: ...


def run_cells(cells: Sequence[PlannedCell], make_spec: Callable[[PlannedCell], SoakSpec], launcher: Launcher,
              events: Events, *, retries: int, cap_s: float, fail_fast: bool = False,
              poll_s: float = 1.0, grace_s: float = STOP_GRACE_S,
              order: Callable[[Sequence[PlannedCell]], list[PlannedCell]] | None = None,
              recheck_s: float = 30.0, stranded_grace_s: float = 120.0,
              clock: Callable[[], float] = time.time) -> RunSummary:
    """Submit every cell (largest first unless `order` says otherwise), retry infra errors elsewhere, report each result as it ends.

    A waiting cell whose GPU type no live node offers any more (its nodes were lost) is given up
    after `stranded_grace_s` as infra_error instead of pending for ever (nodes may come back).
    Ctrl-C (KeyboardInterrupt) and `fail_fast` cancel the remaining cells; cancelled cells are not
    results (a resumed run reruns them). Results already reported are never lost.
    """
    running: dict[Any, Running] = {}
    by_attempt: dict[tuple[str, int], Any] = {}
    results: list[CellResult] = []
    summary = RunSummary(results)

    def submit(pc: PlannedCell, spec: SoakSpec, failed_on: frozenset[str], carried: list[str]) -> None:
        avoid = avoid_on_retry(pc, failed_on, launcher.nodes()) if failed_on else frozenset()
        handle = launcher.submit(spec, pc.ray_label, avoid, cap_s)
        running[handle] = Running(pc, spec, failed_on, retries=carried)
        by_attempt[(pc.id, spec.attempt)] = handle

    last_recheck = clock()
    try:
        for pc in (order or dispatch_order)(cells):
            submit(pc, make_spec(pc), frozenset(), [])
        while running:
            done = launcher.wait(list(running), poll_s)
            for cell_id, attempt, node, at in launcher.started():
                handle = by_attempt.get((cell_id, attempt))
                if handle in running and running[handle].started_at is None:
                    running[handle].node, running[handle].started_at = node, at
                    events.cell_started(running[handle].pc, attempt, node)
            for handle in done:
                item = running.pop(handle)
                result = _collect(launcher, handle, item, cap_s)
                if item.retries:
                    result.retries = [*item.retries, *result.retries]
                if should_retry(result, retries) and item.never_placed is None:
                    events.cell_retrying(item.pc, result)
                    failed_on = item.failed_on | ({item.node} if item.node else frozenset())
                    spec = replace(item.spec, attempt=item.spec.attempt + 1)
                    submit(item.pc, spec, failed_on, [*result.retries, _retry_note(result)])
                    continue
                results.append(result)
                events.cell_finished(item.pc, result)
                if fail_fast and result.outcome.is_finding:
                    summary.stopped_early = True
                    raise _StopRun()
            now = clock()
            for handle, item in running.items():
                if not item.killed_for_cap and overran(item.started_at, now, cap_s, grace_s):
                    item.killed_for_cap = True
                    launcher.cancel(handle, force=True)
            if now - last_recheck >= recheck_s:
                last_recheck = now
                _give_up_stranded(launcher, running, now, stranded_grace_s)
            events.tick()
    except (KeyboardInterrupt, _StopRun) as exc:
        summary.interrupted = isinstance(exc, KeyboardInterrupt)
        summary.unfinished = sorted({item.pc.id for item in running.values()})
        _cancel_all(launcher, running, grace_s)
    except BaseException:
        _cancel_all(launcher, running, grace_s)   # e.g. the store failed: stop the servers, then say why
        raise
    return summary


class _StopRun(Exception):
    pass


def _retry_note(result: CellResult) -> str:
    where = f" on {result.node}" if result.node else ""
    return f"attempt {result.attempt}{where}: {result.message}"


def _give_up_stranded(launcher: Launcher, running: dict[Any, Running], now: float, grace_s: float) -> None:
    waiting = {h: item for h, item in running.items() if item.started_at is None and item.never_placed is None}
    if not waiting:
        return
    problems = stranded([item.pc for item in waiting.values()], launcher.nodes())
    for handle, item in waiting.items():
        problem = problems.get(item.pc.id)
        if problem is None:
            item.stranded_since = None
            continue
        item.stranded_since = item.stranded_since or now
        if now - item.stranded_since >= grace_s:
            item.never_placed = problem
            launcher.cancel(handle, force=False)


def _collect(launcher: Launcher, handle: Any, item: Running, cap_s: float) -> CellResult:
    try:
        result = launcher.result(handle)
    except Exception as exc:  # noqa: BLE001 - every way a task can die is an infra error
        if item.never_placed is not None:
            message = f"never placed: {item.never_placed}"
        elif item.killed_for_cap:
            message = f"overran its hard cap of {cap_s:.0f} s and did not stop; killed"
        else:
            message = f"{type(exc).__name__}: {_first_line(exc)}"
        return infra_result(item.spec, message, node=item.node, started_at=item.started_at)
    result.attempt = item.spec.attempt
    item.node = item.node or str(result.extra.get("ray_node_id", ""))
    if not result.node and item.node:
        result.node = item.node
    result.extra.setdefault("ray_node_id", item.node)
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _cancel_all(launcher: Launcher, running: dict[Any, Running], grace_s: float) -> None:
    """Ask every task to stop (each tears its server down), then kill what is left after grace."""
    handles = list(running)
    for handle in handles:
        launcher.cancel(handle, force=False)
    deadline = time.time() + grace_s
    pending = handles
    while pending and time.time() < deadline:
        try:
            done = launcher.wait(pending, 1.0)
        except KeyboardInterrupt:   # a second Ctrl-C: stop waiting politely
            break
        pending = [h for h in pending if h not in done]
    for handle in pending:
        launcher.cancel(handle, force=True)


# -- Ray ---------------------------------------------------------------------------------------------

class RayLauncher:
    """Launcher on a connected Ray cluster: one task per cell asking `num_gpus=TP` and the GPU
    type's `accelerator_type`, no Ray-level retries (this module decides), a retry avoiding the
    nodes that failed it, and a mailbox actor through which tasks say where and when they began."""

    def __init__(self, run_cell: RunCell | None = None, cpus_per_cell: float = 0.0):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        # on the driver's node: a GPU node may be lost, the driver's node is the run's lifetime anyway
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._mailbox = ray.remote(num_cpus=0)(_Mailbox).options(scheduling_strategy=here).remote()
        self._task = ray.remote(_soak_task)
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


def _soak_task(spec: SoakSpec, mailbox: Any, cap_s: float, run_cell: RunCell | None) -> dict:
    """The Ray task body: runs on the node Ray chose, with the GPUs Ray assigned."""
    import ray

    if run_cell is None:
        from soakmatrix.jobs.soak import run_cell
    node = ray.get_runtime_context().get_node_id()
    mailbox.post.remote((spec.cell_id, spec.attempt, node, time.time()))
    spec = with_assigned_gpus(spec, ray.get_gpu_ids())
    result = run_with_cap(run_cell, spec, cap_s)
    result.extra["ray_node_id"] = node
    if not result.node:
        result.node = node
    return result.to_dict()
