"""The reaper (`jobs/reaper.py`): an owner's engines do not outlive it, however it ends, and the
watcher survives what Ray does to a worker's direct children when the worker exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from soakmatrix.jobs.reaper import OWNER_ENV, Reaper, owned_processes
from tests.conftest import REPO


def private_token() -> str:
    """Not a pid first, as the plugin's are: test_pytest_plugin takes those of gone owners for its own."""
    return f"test_reaper-{os.getpid()}-{time.monotonic_ns()}"


# An owner: starts its reaper, then does what the scenario says (an engine is a sleeping Python
# carrying the token, in a session of its own as server_process.start makes them), prints the
# engines' pids and ends as the scenario says.
OWNER = """
import os, signal, subprocess, sys, time
import psutil
from soakmatrix.jobs.reaper import Reaper

def engine():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={{**os.environ, **reaper.env}}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

reaper = Reaper(token=f"test_reaper-{{os.getpid()}}")
reaper.ensure()
{scenario}
"""

SIGKILLED_MID_CELL = """
first = engine()
time.sleep(1.0)   # the watcher has seen it
print(first.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

# Ray's worker on its way out (RAY_kill_child_processes_on_worker_exit, on by default) SIGKILLs its
# direct children; a soak job's thread that was starting its engine meanwhile starts it afterwards.
RAY_WORKER_EXIT_RACE = """
first = engine()
for child in psutil.Process().children():
    child.kill()
late = engine()
print(first.pid, late.pid, flush=True)
os._exit(0)
"""


def run_owner(scenario: str) -> list[psutil.Process]:
    script = OWNER.format(scenario=textwrap.dedent(scenario))
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip(), done.stderr
    engines = []
    for pid in map(int, done.stdout.split()):
        try:
            engines.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return engines


def still_running(engines: list[psutil.Process], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in engines if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.2)
    for p in alive:
        p.kill()
    return [p.pid for p in alive]


@pytest.mark.parametrize("scenario", [SIGKILLED_MID_CELL, RAY_WORKER_EXIT_RACE], ids=["sigkilled", "ray-exit-race"])
def test_an_owners_engines_are_reaped_when_it_dies(scenario):
    engines = run_owner(scenario)
    assert still_running(engines, timeout_s=20) == []


def test_close_reaps_what_is_left_and_stops_the_watcher():
    reaper = Reaper(token=private_token())
    reaper.ensure()
    watcher = reaper.watcher
    assert watcher is not None and watcher.is_running()
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, **reaper.env}, start_new_session=True)
    try:
        assert [p.pid for p in owned_processes(reaper.token)] == [engine.pid]
        reaper.close()
        assert engine.wait(10) is not None
        assert still_running([watcher], timeout_s=10) == []
        assert reaper.watcher is None
    finally:
        engine.kill()


def test_the_watcher_is_not_a_child_of_its_owner():
    """Ray SIGKILLs a worker's direct children when the worker exits: the watcher must not be one."""
    reaper = Reaper(token=private_token())
    try:
        reaper.ensure()
        assert reaper.watcher.pid not in {p.pid for p in psutil.Process().children()}
        assert reaper.env == {OWNER_ENV: reaper.token}
        before = reaper.watcher.pid
        reaper.ensure()                      # once per owner
        assert reaper.watcher.pid == before
    finally:
        reaper.close()
