"""Shared pieces of the real-engine tests (`tests/test_vllm_*.py`): the hang model that plants one
hang of a style in the fault plugin, one cell soaked through `run_cell` with the server's processes
and shared memory noted, the CLI run on a private Ray cluster offering `cpu` with its teardown on a
timeout, and the checks for server processes a run left alive.

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

MATRIX = REPO / "fixtures" / "vllm_cpu.yaml"


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


def soak_cell(folder: Path, flags: dict, soak_s: float, style: str | None = None, env: dict | None = None):
    """One cell of fixtures/vllm_cpu.yaml (`flags`) through `run_cell`, with a hang of `style` planted
    if given: (the result, the server's pids and /dev/shm segments as seen when it was ready)."""
    from soakmatrix.jobs.soak import run_cell
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.soak_specs import soak_spec_for
    from soakmatrix.matrix.spec import load_matrix

    folder.mkdir(parents=True, exist_ok=True)
    hang_model = planted_hang_model(folder, style) if style else None
    matrix = load_matrix(MATRIX)
    cell = next(pc for pc in plan(matrix).cells if pc.cell.flag_dict == flags)
    spec = soak_spec_for(cell, matrix, backend="vllm", out_dir=folder / "out", soak_s=soak_s,
                         hang_model=str(hang_model) if hang_model else None, env=env or {}, startup_timeout_s=480)
    seen: dict = {"shm": set(), "pids": set()}

    def on_event(kind: str, data: dict) -> None:
        if kind == "ready":   # the process tree is up: note its processes and shared-memory segments
            port = data["base_url"].rsplit(":", 1)[1]
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if "--port" in cmd and port in cmd and "--model" in cmd:
                    for p in [proc, *proc.children(recursive=True)]:
                        seen["pids"].add(p.pid)
                        try:
                            seen["shm"].update(m.path for m in p.memory_maps() if m.path.startswith("/dev/shm/"))
                        except psutil.Error:
                            pass

    return run_cell(spec, on_event=on_event), seen


def assert_nothing_left(result, seen) -> None:
    """The soak's teardown was clean: no process of the server's tree and no shared-memory segment."""
    teardown = result.teardown
    assert teardown["clean"], teardown
    assert len(seen["pids"]) >= 3, "expected API server, EngineCore and a worker"
    alive = [pid for pid in seen["pids"] | set(teardown["pids"])
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"vLLM processes left behind: {alive}"
    assert not [p for p in seen["shm"] if Path(p).exists()], "shared-memory segments left behind"
