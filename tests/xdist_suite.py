"""How the suite runs on pytest-xdist workers (`make test`: four of them, `--dist worksteal`), through
xdist's public hooks only: the order tests are handed out in, and what a worker that dies costs.

Order. xdist's work-stealing scheduler gives each worker a contiguous share of the collection (the
first worker the first len/workers tests, the next an equal share of the rest) and lets an idle
worker steal from the *end* of a busy one's queue, so what heads a share runs on that worker, first.
Four lanes head the shares:

1. and 2. The real-engine tests (marked `vllm`), split by module into two chains of about equal
   cost, the cost being the `vllm serve` starts a module declares (`pytest.mark.vllm(starts=N)`, 0
   when it only imports vLLM). Two engines start side by side, never more: each start is three
   sequential interpreter imports (one core), and a third would starve everything else on 2 cores.
   A module stays in one chain, so a module-scoped engine is started once.
3. The tests that mostly wait (marked `waits`: a simulated server's clock, a watch's interval, at a
   tenth of a core or less). They cost the real engines almost nothing beside them, and left for
   later they would hold workers while the CPU idles.
4. The tests that start a Ray Client server (marked `ray_client`): they take turns through a lock
   (tests/conftest.py: ray_client_ports), so in one lane they run one after another instead of one
   worker waiting idle for another's.

With fewer workers than lanes the lanes that have no worker of their own join the last one's; with
one worker (or without xdist) the lanes run first in that order. The rest follows in collection
order, filling each share to its size. The order is a pure function of the node ids and the worker
count, so every worker collects the same list (xdist refuses to run otherwise).

A crashed worker. A worker process that dies under a test (xdist: "node down: Not properly
terminated") has given no verdict on it: the test's own assertions never ran. As the soak jobs do
with an infrastructure error, the test runs once more, on the worker xdist starts in its place, and
its first try is reported as `rerun` (with the crash, in a section of the summary of its own), not
as a failure. A second crash of the same test is a failure: a test that kills its worker is not
retried for ever.
"""

from __future__ import annotations

import pytest

CRASH_RERUNS = 1           # more runs of a test whose worker died under it
RERUN = "rerun"            # the first try's outcome (pytest-rerunfailures' word for the same)

_crashes: dict[str, int] = {}   # node id -> its workers that died under it (the controller's count)


def runs_the_real_engine(item) -> bool:
    return item.get_closest_marker("vllm") is not None


def engine_starts(item) -> int:
    """The `vllm serve` starts the item's module declares (`pytest.mark.vllm(starts=N)`; default 0)."""
    marker = item.get_closest_marker("vllm")
    return int(marker.kwargs.get("starts", 0)) if marker is not None else 0


def module_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def two_chains(real: list) -> tuple[list, list]:
    """The real-engine tests in two chains of about equal cost, a module never split: the costliest
    module first to the cheaper chain (ties by name, so the split is the same on every worker)."""
    modules: dict[str, list] = {}
    for item in real:
        modules.setdefault(module_of(item), []).append(item)
    cost = {name: max(engine_starts(item) for item in group) for name, group in modules.items()}
    chains: tuple[list, list] = ([], [])
    totals = [0, 0]
    for name in sorted(modules, key=lambda name: (-cost[name], name)):
        cheaper = 0 if totals[0] <= totals[1] else 1
        chains[cheaper].extend(modules[name])
        totals[cheaper] += cost[name]
    return chains


def lanes(items: list) -> list[list]:
    """The suite's four lanes (the module docstring), each in collection order but the chains."""
    real = [item for item in items if runs_the_real_engine(item)]
    first, second = two_chains(real)
    waiting = [item for item in items if not runs_the_real_engine(item) and marked(item, "waits")
               and not marked(item, "ray_client")]
    client = [item for item in items if not runs_the_real_engine(item) and marked(item, "ray_client")]
    return [first, second, waiting, client]


def marked(item, name: str) -> bool:
    return item.get_closest_marker(name) is not None


def share_sizes(count: int, workers: int) -> list[int]:
    """The share of `count` tests worksteal hands each of `workers` workers at the start."""
    sizes = []
    for worker in range(workers):
        sizes.append((count - sum(sizes)) // (workers - worker))
    return sizes


def suite_order(items: list, workers: int) -> None:
    """In place: each lane at the head of its worker's share (the lanes past the last worker join its
    lane), each share filled to its size with the rest in collection order."""
    heads = lanes(items)
    in_lanes = {id(item) for lane in heads for item in lane}
    rest = [item for item in items if id(item) not in in_lanes]
    if workers < 2:
        items[:] = [item for lane in heads for item in lane] + rest
        return
    heads = heads[: workers - 1] + [[item for lane in heads[workers - 1:] for item in lane]]
    heads += [[] for _ in range(workers - len(heads))]
    ordered: list = []
    for lane, size in zip(heads, share_sizes(len(items), workers)):
        fill = max(0, size - len(lane))
        ordered += lane + rest[:fill]
        rest = rest[fill:]
    items[:] = ordered + rest


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """The first CRASH_RERUNS crashes under a test reschedule it and report the try as `rerun`; after
    those, the crash stays the failure xdist reports. A test that hung past its timeout is not run again."""
    _crashes[crashitem] = _crashes.get(crashitem, 0) + 1
    if _crashes[crashitem] > CRASH_RERUNS or getattr(report, "stopped_past_timeout", False):   # tests/suite_watch.py
        return
    try:
        sched.mark_test_pending(crashitem)
    except NotImplementedError:   # a scheduler that cannot run a test again (each, loadscope): the crash is the verdict
        return
    report.outcome = RERUN        # type: ignore[assignment]


def pytest_report_teststatus(report, config) -> tuple[str, str, tuple[str, dict]] | None:
    if report.outcome == RERUN:
        return RERUN, "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    reruns = terminalreporter.stats.get(RERUN, [])
    if not reruns:
        return
    terminalreporter.write_sep("=", "tests run again after their worker died", yellow=True)
    for report in reruns:
        terminalreporter.write_line(f"{report.nodeid}: {report.longrepr}; run again on a new worker")
