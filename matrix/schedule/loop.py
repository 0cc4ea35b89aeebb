"""The driver's loop: submit every cell, retry infra errors on other nodes, enforce the hard cap,
give up on cells no node can host any more, report each result as it ends.

Its side effects go through a `Launcher` (`RayLauncher` in production: tasks, cancellation, the
start-event mailbox), so the loop is tested with a fake launcher and no Ray at all. Outcomes (as
Ray's release tooling splits them): a lost node, a killed worker, a task that overran its hard cap
or an error inside the soak job is an `infra_error`, retried on another node up to the profile's
`retries`; a hang or crash is the finding and never retried. A lost head or driver's node
(`cluster_loss`) ends the loop with what finished; the rest is left to a resumed run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.plan import PlannedCell

from .cluster_loss import ClusterLost, cluster_lost
from .placement import Node, avoid_on_retry, dispatch_order, stranded

STOP_GRACE_S = 60.0  # a cancelled cell gets this long to tear its server down
DEFAULT_CAP_MARGIN_S = 600.0


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


def infra_result(
    spec: SoakSpec, message: str, *, node: str = "", started_at: float | None = None, retries: Sequence[str] = ()
) -> CellResult:
    """A result for a cell that produced none itself (node lost, worker killed, never placed)."""
    now = time.time()
    return CellResult(
        cell_id=spec.cell_id,
        cell_name=spec.cell_name,
        outcome=Outcome.INFRA_ERROR,
        model=spec.model,
        gpu_type=spec.gpu_type,
        workload=spec.workload.name,
        flags=dict(spec.flags),
        message=message,
        node=node,
        gpu_count=spec.gpu_count,
        engine=spec.backend,
        started_at=started_at or now,
        ended_at=now,
        attempt=spec.attempt,
        retries=list(retries),
        build=spec.build,
        build_ordinal=spec.build_ordinal,
    )


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

    def cancel(self, handle: Any, force: bool) -> None: ...

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
    stranded_since: float | None = None  # first seen waiting with no live node able to host it
    never_placed: str | None = None  # why it was given up on while waiting


@dataclass
class RunSummary:
    results: list[CellResult]
    interrupted: bool = False
    stopped_early: bool = False  # --fail-fast found something and cancelled the rest
    unfinished: list[str] = field(default_factory=list)
    lost: str | None = None  # why the cluster is gone (`cluster_loss`), when it ended the run


class Events(Protocol):
    """What the loop reports; the progress display and the result writers listen."""

    def cell_started(self, pc: PlannedCell, attempt: int, node: str) -> None: ...
    def cell_retrying(self, pc: PlannedCell, result: CellResult) -> None: ...
    def cell_finished(self, pc: PlannedCell, result: CellResult) -> None: ...
    def tick(self) -> None: ...


def run_cells(
    cells: Sequence[PlannedCell],
    make_spec: Callable[[PlannedCell], SoakSpec],
    launcher: Launcher,
    events: Events,
    *,
    retries: int,
    cap_s: float,
    fail_fast: bool = False,
    poll_s: float = 1.0,
    grace_s: float = STOP_GRACE_S,
    order: Callable[[Sequence[PlannedCell]], list[PlannedCell]] | None = None,
    recheck_s: float = 30.0,
    stranded_grace_s: float = 120.0,
    clock: Callable[[], float] = time.time,
) -> RunSummary:
    """Submit every cell (largest first unless `order` says otherwise), retry infra errors elsewhere, report each result as it ends.

    A waiting cell whose GPU type no live node offers any more (its nodes were lost) is given up
    after `stranded_grace_s` as infra_error instead of pending for ever (nodes may come back).
    Ctrl-C (KeyboardInterrupt) and `fail_fast` cancel the remaining cells; cancelled cells are not
    results (a resumed run reruns them). Results already reported are never lost. So is a lost
    cluster: an error of the launcher's own calls that `cluster_lost` reads as the head or the driver's
    node gone ends the loop with `summary.lost` set and the cells under way unfinished.
    """
    launcher = _Guarded(launcher)
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
    except ClusterLost as exc:
        summary.lost = str(exc)
        summary.unfinished = sorted({item.pc.id for item in running.values()})
        for handle in running:  # nothing to wait for: the tasks end with their raylets or the job
            launcher.cancel(handle, force=False)
    except BaseException:
        _cancel_all(launcher, running, grace_s)  # e.g. the store failed: stop the servers, then say why
        raise
    return summary


class _StopRun(Exception):
    pass


class _Guarded:
    """The launcher, an error of its own calls that means a lost cluster raised as `ClusterLost`.
    A task's result is not guarded: a cell dying with its worker node is that cell's infra error."""

    def __init__(self, launcher: Launcher):
        self._launcher = launcher

    def _call(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except ClusterLost:
            raise
        except Exception as exc:
            why = cluster_lost(exc)
            if why is None:
                raise
            raise ClusterLost(why) from exc

    def submit(self, spec: SoakSpec, ray_label: str, avoid_nodes: frozenset[str], cap_s: float) -> Any:
        return self._call(self._launcher.submit, spec, ray_label, avoid_nodes, cap_s)

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        return self._call(self._launcher.wait, handles, timeout_s)

    def result(self, handle: Any) -> CellResult:
        return self._launcher.result(handle)

    def cancel(self, handle: Any, force: bool) -> None:
        try:
            self._launcher.cancel(handle, force)
        except Exception as exc:  # a cancel that cannot reach the cluster has nothing to stop
            if cluster_lost(exc) is None:
                raise

    def nodes(self) -> list[Node]:
        return self._call(self._launcher.nodes)

    def started(self) -> list[tuple[str, int, str, float]]:
        return self._call(self._launcher.started)


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
    item.node = item.node or result.ray_node_id
    if not result.node and item.node:
        result.node = item.node
    result.ray_node_id = result.ray_node_id or item.node
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
        except (KeyboardInterrupt, ClusterLost):  # a second Ctrl-C, or no cluster left to wait for
            break
        pending = [h for h in pending if h not in done]
    for handle in pending:
        launcher.cancel(handle, force=True)
