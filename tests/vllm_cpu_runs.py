"""Shared pieces of the real-engine tests (`tests/test_vllm_*.py`): the hang model that plants one
hang of a style in the fault plugin, the CLI run on a private Ray cluster offering `cpu` with its
teardown on a timeout, and the check for server processes a run left alive.

They run vLLM's CPU build, so each costs minutes: the helpers keep one way of starting, timing out
and cleaning up, so a fix to any of it reaches every test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterable

import psutil
import pytest
from tests.conftest import REPO


def planted_hang_model(folder: Path, style: str, mttf_s: float = 6, seed: int = 5) -> Path:
    """A hang model (in `folder`) planting one hang of `style` in every `--enforce-eager` cell once a
    request runs: the fault plugin's `planted-<style>`."""
    path = folder / f"{style}.yaml"
    path.write_text(textwrap.dedent(f"""\
        seed: {seed}
        hangs:
          - id: planted-{style}
            style: {style}
            when: {{enforce_eager: true}}
            min_running: 1
            mttf_s: {mttf_s:g}
        """))
    return path


def run_cli_on_cpu_ray(cli_args: list[str], timeout_s: float, what: str,
                       on_timeout: Callable[[str], str] | None = None) -> tuple[int, str, str, float]:
    """`python -m soakmatrix.matrix.cli *cli_args` under `soakmatrix.fixtures.cpu_ray`, as a user runs
    it: (exit code, stdout, stderr, wall seconds). On a timeout: Ctrl-C (the CLI tears its servers
    down), SIGKILL for what is left after 90 s, `on_timeout(stderr)` (cleans up and returns what the
    failure should show; default: the ends of stdout and stderr), and the test fails."""
    cli = [sys.executable, "-m", "soakmatrix.matrix.cli", *cli_args]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "soakmatrix.fixtures.cpu_ray", *cli], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        shown = on_timeout(stderr) if on_timeout else f"{stdout[-2000:]}\n{stderr[-3000:]}"
        pytest.fail(f"{what} did not finish in {timeout_s:.0f} s\n{shown}")
    return proc.returncode, stdout, stderr, time.monotonic() - t0


def still_alive(found: Iterable[psutil.Process], grace_s: float = 0.0) -> list[psutil.Process]:
    """The processes of `found` (never this one) that are still running after `grace_s` (one still
    exiting may take that long; a leak lives on); zombies do not count."""
    found = [p for p in found if p.pid != os.getpid()]
    if grace_s and found:
        _, found = psutil.wait_procs(found, timeout=grace_s)
    alive = []
    for proc in found:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            pass
    return alive
