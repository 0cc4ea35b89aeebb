"""How the suite runs on pytest-xdist workers (`make test`: two of them): which tests go together, in
what order, and what a worker that dies under a test costs.

Units of work. The tests are handed out a module at a time (a module's fixtures are set up once),
and the modules with a real-engine test form one unit of work, handed out first: two `vllm serve`
start-ups side by side on 2 cores would each take minutes, while one beside simulated-engine tests
takes about what it takes beside a benchmark (docs/vllm.md). That unit is the longest, so it starts
first and the other worker drains the rest. (xdist's own `loadgroup` renames node ids to group them,
which pytest 9.2's structured node ids ignore: a scheduler that names the scope is what works.) The
modules that start a Ray Client server share a unit too: each server hands its sessions ports
counted up from 23000, so two at once collide ("SpecificServer startup failed", seen under -n 2).

A crashed worker. A worker process that dies under a test (xdist: "node down: Not properly
terminated") has given no verdict on it: the test's own assertions never ran. As the soak jobs do
with an infrastructure error, the test is run once more, on the worker xdist starts in its place,
and its first try is reported as `rerun` (with the crash, in a section of the summary of its own),
not as a failure. A second crash of the same test is a failure: a test that kills its worker is
not retried for ever. Seen in 2 of the suite's first 7 runs on two workers, both in
tests/test_schedule.py's `ray_cluster` fixture as it started a Ray head, without a segfault, an OOM
kill or a line in Ray's logs (README, Known limits).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

REAL_ENGINE_GROUP = "real-engine"
RAY_CLIENT_GROUP = "ray-client"
REAL_ENGINE_MARK = re.compile(r"\bmark\.vllm\b")
RAY_CLIENT_USE = re.compile(r"\bray_client_cluster\(")
CRASH_RERUNS = 1           # more runs of a test whose worker died under it
RERUN = "rerun"            # the first try's outcome (pytest-rerunfailures' word for the same)

_crashes: dict[str, int] = {}   # node id -> its workers that died under it (the controller's count)


@functools.cache
def modules_matching(pattern: re.Pattern) -> frozenset[str]:
    """Test files (names) whose source matches: the same answer in the controller and each worker."""
    return frozenset(path.name for path in Path(__file__).parent.glob("test_*.py") if pattern.search(path.read_text()))


def real_engine_modules() -> frozenset[str]:
    """Test files that mark a test `vllm`."""
    return modules_matching(REAL_ENGINE_MARK)


def work_unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    name = Path(module).name
    if name in real_engine_modules():
        return REAL_ENGINE_GROUP
    return RAY_CLIENT_GROUP if name in modules_matching(RAY_CLIENT_USE) else module


def real_engine_first(items: list) -> None:
    """A worker reports its tests in this order, and units are handed out in it (stable sort)."""
    items.sort(key=lambda item: work_unit(item.nodeid) != REAL_ENGINE_GROUP)


@pytest.hookimpl(optionalhook=True)   # without xdist (`-p no:xdist`) there is no such hook
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModulesRealEngineFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def remove_node(self, node) -> str | None:
            """A worker is gone: put its unfinished units back in the queue, and only those.
            LoadScope's own puts back every unit the worker was ever given, finished ones too; a
            finished unit handed out again sends a worker no test, so no report comes back to hand
            out the next unit, and the run waits for ever with both workers idle (a clean-clone run:
            after the worker crash in test_schedule.py, 8 tests were never run; CI's 90 min ran out)."""
            workload = self.assigned_work.get(node, {})
            for scope in [scope for scope, unit in workload.items() if all(unit.values())]:
                del workload[scope]
            return super().remove_node(node)

        def mark_test_pending(self, item: str) -> None:
            """Run `item` again: `remove_node` has already put the dead worker's unfinished tests back
            in the queue, this one among them (it never completed); hand them out."""
            for node in self.assigned_work:
                self._reschedule(node)

        def give_up(self, item: str) -> None:
            """Do not run `item` again (LoadScope's `remove_node` queues it after every crash, up to
            xdist's limit of replaced workers)."""
            for scope, unit in list(self.workqueue.items()):
                if item in unit:
                    unit[item] = True
                    if all(unit.values()):
                        del self.workqueue[scope]

    return ModulesRealEngineFirst(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """The first CRASH_RERUNS crashes under a test reschedule it and report the try as `rerun`; after
    those, the crash stays the failure xdist reports. A test that hung past its timeout is not run again."""
    _crashes[crashitem] = _crashes.get(crashitem, 0) + 1
    if _crashes[crashitem] > CRASH_RERUNS or getattr(report, "stopped_past_timeout", False):   # tests/suite_watch.py
        if give_up := getattr(sched, "give_up", None):
            give_up(crashitem)
        return
    try:
        sched.mark_test_pending(crashitem)
    except NotImplementedError:   # a scheduler that cannot run a test again: the crash is the verdict
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
