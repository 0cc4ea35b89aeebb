"""How the suite runs on pytest-xdist workers (`make test`: three of them, `--dist worksteal`), through
xdist's public hooks only: the order tests are handed out in, and what a worker that dies costs.

Order. xdist's work-stealing scheduler gives each worker a contiguous share of the collection and
lets an idle worker steal from the *end* of a busy one's queue. The real-engine tests are put first,
so they all land at the head of the first worker's share and run there one after another: two
`vllm serve` start-ups side by side on 2 cores would each take minutes, and no steal ever reaches
the head of a queue. The order is a pure function of the node ids, so every worker collects the same
list (xdist refuses to run otherwise).

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


def real_engine_first(items: list) -> None:
    """Stable: the tests marked `vllm` first, each group otherwise in collection order."""
    items.sort(key=lambda item: not runs_the_real_engine(item))


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
