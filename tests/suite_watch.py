"""What the suite tells while it runs long, and the limits that keep it from running for ever.

CI gives `make test` 90 minutes and keeps only the tail of what it printed. A run that hangs there
ends as "Terminated" with nothing said about which test hung or where (stop 41: 872 of 880 reports,
then silence until CI's limit). So the suite watches itself, and says it in its own output:

- **What is running.** Every REPORT_EVERY_S the controller prints which tests run and for how long,
  the load, and the processes that used the most CPU since (a process a test left behind shows there).
- **A test past its timeout.** pytest-timeout's signal stops a test at its timeout, but only when
  Python gets to run: a test blocked in C (a lock, a socket in a library's own thread), or whose
  teardown blocks again after the signal, is never stopped. Each test arms a backstop of its own
  (`faulthandler.dump_traceback_later`, which runs in C): HANG_GRACE_S after the timeout it writes
  every thread's stack to a file and ends the worker. The controller reports that test as failed,
  with those stacks, and does not run it again (a worker that died for another reason does get a
  second try: tests/xdist_suite.py). Without workers it ends the run, so the stacks go to stderr.
- **The suite's deadline.** At DEADLINE_S the controller prints the tests still running and each
  worker's stacks (faulthandler on SIGUSR1, which a blocked worker answers too), and interrupts the
  run: pytest then prints its summary, failures included, before CI's own limit would cut it off.

The limits are environment variables, so a slow machine can give more: SOAKMATRIX_SUITE_DEADLINE_S,
SOAKMATRIX_SUITE_REPORT_S, SOAKMATRIX_TEST_HANG_GRACE_S. 0 turns one off.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

DEADLINE_S = float(os.environ.get("SOAKMATRIX_SUITE_DEADLINE_S", 78 * 60))   # CI: 90 min, install included
REPORT_EVERY_S = float(os.environ.get("SOAKMATRIX_SUITE_REPORT_S", 10 * 60))
HANG_GRACE_S = float(os.environ.get("SOAKMATRIX_TEST_HANG_GRACE_S", 120))     # time for teardown
DUMPS_ENV = "SOAKMATRIX_SUITE_DUMPS"     # the run's directory of stacks (the controller's, workers inherit it)
STACKS_SIGNAL = signal.SIGUSR1
STACK_LINES = 300                        # of one worker's stacks, printed at the deadline

_running: dict[str, float] = {}          # node id -> when it started (monotonic), in the controller
_collected: set[str] = set()             # what the run is to run, and what of it has finished
_finished: set[str] = set()
_started = time.monotonic()
_config: pytest.Config | None = None
_stderr_fd: int | None = None            # without workers: the terminal's stderr, for the backstop's stacks


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _dumps() -> Path:
    return Path(os.environ[DUMPS_ENV])


def _hang_file(nodeid: str) -> Path:
    return _dumps() / f"hung-{hashlib.sha1(nodeid.encode()).hexdigest()[:16]}.txt"


def _say(line: str) -> None:
    reporter = _config and _config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    capture = _config.pluginmanager.get_plugin("capturemanager")   # without workers a test's output is captured
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if reporter._tw.width_of_current_line:   # not after the progress dots of the line being written
            reporter._tw.line()
        reporter.write_line(line)
        reporter._tw.flush()


def item_timeout(item: pytest.Item) -> float:
    """The timeout pytest-timeout applies to `item` (its marker, else the command line or ini)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    return float(option if option is not None else (item.config.getini("timeout") or 0))


def stopped_past_timeout(nodeid: str) -> str | None:
    """The stacks `nodeid`'s backstop wrote when it ended its worker, if it did."""
    if DUMPS_ENV not in os.environ:
        return None
    path = _hang_file(nodeid)
    text = path.read_text(errors="replace") if path.exists() else ""
    path.unlink(missing_ok=True)
    return text or None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config
    if _is_worker(config):
        if DUMPS_ENV in os.environ:
            worker = config.workerinput["workerid"]
            stacks = open(_dumps() / f"{worker}.stacks", "w")   # noqa: SIM115 - open for the process's life
            faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
            (_dumps() / f"{worker}.pid").write_text(str(os.getpid()))
        return
    # a run of its own, even inside a test of this suite (a pytest a test starts inherits the variable)
    os.environ[DUMPS_ENV] = tempfile.mkdtemp(prefix="soakmatrix-suite-")
    # without workers a backstop ends the only process, so no one would read its file: its stacks go
    # to the terminal instead (capture is suspended here, so fd 2 is still the real stderr)
    global _stderr_fd
    _stderr_fd = os.dup(2)
    if DEADLINE_S > 0 or REPORT_EVERY_S > 0:
        threading.Thread(target=_watch, name="suite-watch", daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    timeout = item_timeout(item)
    if HANG_GRACE_S <= 0 or timeout <= 0 or DUMPS_ENV not in os.environ:
        yield
        return
    path = _hang_file(item.nodeid)
    with open(path, "w") as dump:   # empty unless the backstop fires: a worker that died otherwise leaves it so
        alone = not _is_worker(item.config) and _stderr_fd is not None
        faulthandler.dump_traceback_later(timeout + HANG_GRACE_S, exit=True, file=_stderr_fd if alone else dump)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
    path.unlink(missing_ok=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """A worker died under `crashitem`: say so now (CI may keep no summary), and if its backstop ended
    it, make its stacks the failure and mark it, so that it is not run again."""
    stacks = stopped_past_timeout(crashitem)
    _say(f"worker died under {crashitem}" + (", stopped past its timeout" if stacks else ""))
    if stacks:
        report.longrepr = f"{report.longrepr}: still running {HANG_GRACE_S:.0f} s past its timeout; its stacks:\n{stacks}"
        report.stopped_past_timeout = True   # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _is_worker(config) and DUMPS_ENV in os.environ:
        shutil.rmtree(_dumps(), ignore_errors=True)


def pytest_runtest_logstart(nodeid: str, location) -> None:
    if _config is not None and not _is_worker(_config):
        _running[nodeid] = time.monotonic()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    _collected.update(ids)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _is_worker(session.config):   # without workers, the controller collects
        _collected.update(item.nodeid for item in session.items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("teardown", "???"):   # "???": xdist's report for a test whose worker died
        _running.pop(report.nodeid, None)
        if report.when == "teardown" or report.outcome != "rerun":
            _finished.add(report.nodeid)


def running_now(now: float) -> list[str]:
    return [f"{nodeid} ({(now - start) / 60:.1f} min)" for nodeid, start in sorted(_running.items(), key=lambda x: x[1])]


def _cpu_seconds() -> dict[int, tuple[float, str]]:
    """Each process's CPU seconds so far and a short name for it."""
    seen = {}
    for process in psutil.process_iter(["cpu_times", "cmdline", "name"]):
        times, cmdline = process.info["cpu_times"], process.info["cmdline"]
        if times is None:
            continue
        name = " ".join(" ".join(cmdline).split())[:80] if cmdline else (process.info["name"] or "?")
        seen[process.pid] = (times.user + times.system, name)
    return seen


def busiest(before: dict[int, tuple[float, str]], after: dict[int, tuple[float, str]], count: int = 3) -> list[str]:
    """The processes that used the most CPU between two snapshots: a leftover engine spinning on a
    core slows every later test, and is what to look for when the suite runs long."""
    used = [(seconds - before.get(pid, (0.0, ""))[0], pid, name) for pid, (seconds, name) in after.items()]
    return [f"{name} (pid {pid}, {cpu:.0f} s)" for cpu, pid, name in sorted(used, reverse=True)[:count] if cpu >= 1]


def _watch() -> None:
    next_report = _started + REPORT_EVERY_S if REPORT_EVERY_S > 0 else float("inf")
    deadline = _started + DEADLINE_S if DEADLINE_S > 0 else float("inf")
    last_cpu = _cpu_seconds()
    while True:
        now = time.monotonic()
        if now >= deadline:
            _at_deadline(now)
            return
        if now >= next_report:
            running, cpu = running_now(now), _cpu_seconds()
            _say(f"[suite {(now - _started) / 60:.0f} min] running: {', '.join(running) or 'nothing'}; "
                 f"load {os.getloadavg()[0]:.1f}; busiest since the last report: {', '.join(busiest(last_cpu, cpu)) or '-'}")
            last_cpu = cpu
            next_report += REPORT_EVERY_S
        time.sleep(max(0.05, min(next_report, deadline) - time.monotonic()))


def _at_deadline(now: float) -> None:
    _say("")
    _say(f"the suite's deadline ({DEADLINE_S / 60:.0f} min, SOAKMATRIX_SUITE_DEADLINE_S) passed; still running:")
    for line in running_now(now) or ["nothing"]:
        _say(f"  {line}")
    unfinished = len(_collected - _finished)
    _say(f"{unfinished} of {len(_collected)} tests not finished" + (
        ", none running: the workers were handed no more (tests/xdist_suite.py)" if unfinished and not _running else ""))
    pids = {path.stem: int(path.read_text()) for path in _dumps().glob("*.pid")}
    for pid in pids.values():
        try:
            os.kill(pid, STACKS_SIGNAL)
        except ProcessLookupError:
            pass
    if pids:
        time.sleep(3)
    else:   # one process, no workers: its own stacks
        pids = {"main": os.getpid()}
        with open(_dumps() / "main.stacks", "w") as stacks:
            faulthandler.dump_traceback(file=stacks, all_threads=True)
    for worker in sorted(pids):
        stacks = (_dumps() / f"{worker}.stacks").read_text(errors="replace").splitlines()
        if stacks:
            _say(f"stacks of worker {worker} (the last {min(len(stacks), STACK_LINES)} lines):")
            for line in stacks[-STACK_LINES:]:
                _say(f"  {line}")
    # a real SIGINT to the main thread: it also ends a sleep or wait there (interrupt_main would not)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
