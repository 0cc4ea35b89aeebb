"""How the suite runs on pytest-xdist workers (`make test`: three of them, `--dist worksteal`), through
xdist's public hooks only: the order tests are handed out in, and what a worker that dies costs.

Order. xdist's work-stealing scheduler gives each worker a contiguous share of the collection (the
first worker the first len/workers tests, the next an equal share of the rest) and lets an idle
worker steal from the *end* of a busy one's queue. The real-engine tests (marked `vllm`) are split
by module into two chains of about equal cost, the cost being the `vllm serve` starts a module
declares (`pytest.mark.vllm(starts=N)`, 0 when it only imports vLLM); one chain is put at the head
of the first worker's share, the other at the head of the second's, where no steal reaches. So two
engines start side by side, never more: each `vllm serve` start is three sequential interpreter
imports (one core), and a third would starve the simulated-engine tests on 2 cores. A module stays
in one chain, so a module-scoped engine is started once. The order is a pure function of the node
ids and the worker count, so every worker collects the same list (xdist refuses to run otherwise).
With one worker the two chains simply run first; without xdist the collection order stands.

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


def suite_order(items: list, workers: int) -> None:
    """In place: one chain of real-engine tests at the head of the first worker's share, the other at
    the head of the second's (both first without workers); the rest in collection order."""
    real = [item for item in items if runs_the_real_engine(item)]
    rest = [item for item in items if not runs_the_real_engine(item)]
    first, second = two_chains(real)
    if workers < 2:
        items[:] = first + second + rest
        return
    share = len(items) // workers                    # worksteal's first share
    head = max(0, share - len(first))                # the rest that fills the first share
    items[:] = first + rest[:head] + second + rest[head:]


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
