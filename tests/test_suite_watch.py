"""The suite's own watch (tests/suite_watch.py), in small suites of their own on two xdist workers: a
test that blocks past its timeout is stopped with its stacks and not run again, the deadline prints
what is still running with the workers' stacks and ends the run with its summary, and what runs is
said as it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow   # each test runs a small suite of its own under the suite watch

CONFTEST = f'''
import sys
sys.path.insert(0, {str(REPO)!r})
from tests import suite_watch
from tests.xdist_suite import pytest_handlecrashitem, pytest_report_teststatus, pytest_terminal_summary  # noqa: F401


def pytest_configure(config):
    config.pluginmanager.register(suite_watch, "soakmatrix-suite-watch")
'''

HANGS = '''
import time

import pytest


@pytest.mark.timeout(1)
def test_blocks_past_its_timeout():
    try:
        time.sleep(60)
    except BaseException:   # pytest-timeout's signal came; block again, as a stuck teardown does
        time.sleep(60)


def test_quick():
    pass
'''

SLOW = '''
import time


def test_sleeps_long():
    time.sleep(60)
'''

QUICK = '''
def test_quick():
    pass
'''


def run_suite(tmp_path, source: str, workers: bool = True, **limits: float) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(source)
    (tmp_path / "test_quick.py").write_text(QUICK)   # a module of its own: the other worker's unit
    env = {**os.environ, **{name: str(value) for name, value in limits.items()}}
    spread = ["-n", "2"] if workers else ["-p", "no:xdist"]
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", *spread, "-p", "no:cacheprovider", "-ra", "--rootdir",
                          str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    return run, time.monotonic() - started


def test_a_test_blocked_past_its_timeout_is_stopped_with_its_stacks_and_not_run_again(tmp_path):
    run, took = run_suite(tmp_path, HANGS, SOAKMATRIX_TEST_HANG_GRACE_S=2, SOAKMATRIX_SUITE_REPORT_S=0)
    out = run.stdout
    assert run.returncode == 1, out[-3000:]
    assert took < 40, out[-3000:]                            # not the 120 s the test would sleep
    assert "1 failed, 2 passed" in out and "rerun" not in out.splitlines()[-1], out[-3000:]
    assert "worker died under test_suite.py::test_blocks_past_its_timeout, stopped past its timeout" in out
    failure = out[out.index("still running 2 s past its timeout"):]
    assert "in test_blocks_past_its_timeout" in failure      # its stack, down to the line that blocks
    assert "FAILED test_suite.py::test_blocks_past_its_timeout" in out


def test_at_the_deadline_the_run_says_what_still_runs_with_the_workers_stacks_and_ends_with_its_summary(tmp_path):
    # a report every 3 s until the deadline at 10 s: on a busy machine the workers may still be starting
    # at the first one ("running: nothing"), so a later one names the test
    run, took = run_suite(tmp_path, SLOW, SOAKMATRIX_SUITE_DEADLINE_S=10, SOAKMATRIX_SUITE_REPORT_S=3)
    out = run.stdout
    assert run.returncode == 2, out[-3000:]                   # pytest's "interrupted": CI fails, with a summary
    assert took < 40, out[-3000:]
    assert re.search(r"\[suite 0 min\] running: test_suite.py::test_sleeps_long \(0\.\d min\); load ", out), out[-3000:]
    deadline = out[out.index("the suite's deadline (0 min, SOAKMATRIX_SUITE_DEADLINE_S) passed; still running:"):]
    assert re.search(r"  test_suite.py::test_sleeps_long \(0\.\d min\)\n1 of 2 tests not finished\n", deadline), deadline
    assert "stacks of worker gw" in deadline and "in test_sleeps_long" in deadline
    assert "1 passed" in deadline.splitlines()[-1], out[-3000:]


def test_without_workers_the_deadline_prints_the_runs_own_stacks(tmp_path):
    run, took = run_suite(tmp_path, SLOW, workers=False, SOAKMATRIX_SUITE_DEADLINE_S=3, SOAKMATRIX_SUITE_REPORT_S=0)
    out = run.stdout
    assert run.returncode == 2, out[-3000:]
    assert took < 40, out[-3000:]
    deadline = out[out.index("passed; still running:"):]
    assert "test_suite.py::test_sleeps_long" in deadline and "1 of 2 tests not finished" in deadline
    assert "stacks of worker main" in deadline and "in test_sleeps_long" in deadline


def test_without_workers_a_test_blocked_past_its_timeout_ends_the_run_with_its_stacks_on_stderr(tmp_path):
    run, took = run_suite(tmp_path, HANGS, workers=False, SOAKMATRIX_TEST_HANG_GRACE_S=2, SOAKMATRIX_SUITE_REPORT_S=0)
    assert run.returncode != 0 and took < 40, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Timeout (0:00:03)!" in run.stderr, run.stderr[-3000:]
    stacks = run.stderr[run.stderr.index("Timeout (0:00:03)!"):]
    assert "in test_blocks_past_its_timeout" in stacks, stacks


def test_the_busiest_processes_are_those_that_used_the_most_cpu_between_two_reports():
    from tests.suite_watch import busiest

    before = {1: (100.0, "ray::IDLE"), 2: (5.0, "vllm serve m"), 3: (50.0, "python -m pytest")}
    after = {1: (101.5, "ray::IDLE"), 2: (605.0, "vllm serve m"), 3: (80.0, "python -m pytest"), 4: (0.2, "sleep 9")}
    assert busiest(before, after) == ["vllm serve m (pid 2, 600 s)", "python -m pytest (pid 3, 30 s)",
                                      "ray::IDLE (pid 1, 2 s)"]
    assert busiest(before, after, count=1) == ["vllm serve m (pid 2, 600 s)"]
