"""The README's commands after the demo run as written: a user's first bisections of each kind and
the dashboard that shows them, through the real CLI on a store the demo's way of running writes."""

from __future__ import annotations

import shlex
import subprocess
import sys

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.history import HistoryStore
from tests.conftest import REPO

import pytest

pytestmark = pytest.mark.slow   # the README's commands run as written, as subprocesses

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]


def after_the_demo() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    block = text[text.index("After the demo"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    return [shlex.split(line) for line in block.splitlines() if line.strip() and not line.startswith("#")]


def demo_store(path) -> None:
    """What `make demo` leaves for the failing cell the README bisects: one run, its hang recorded."""
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    spec = load_matrix(REPO / "matrix" / "examples" / "demo.yaml")
    cell = next(pc.cell for pc in plan(spec).cells if pc.cell.id == "8bd3ec0fc86a")
    with HistoryStore(path) as store:
        run = store.start_run(matrix="matrix/examples/demo.yaml", profile="demo")
        store.planned(run, [{"id": cell.id, "name": cell.name, "model": cell.model, "gpu": cell.gpu,
                             "flags": cell.flag_dict, "workload": cell.workload}])
        store.record(run, CellResult(cell_id=cell.id, cell_name=cell.name, outcome="hang", model=cell.model,
                                     gpu_type=cell.gpu, workload=cell.workload, flags=cell.flag_dict, gpu_count=2,
                                     engine="sim", started_at=1.79e9, ended_at=1.79e9 + 20, exposure_s=450.0,
                                     time_to_hang_s=450.0, signature="shm_broadcast_timeout"))
        store.finish_run(run, "found")


def test_the_commands_after_the_demo_run_as_written(tmp_path):
    commands = after_the_demo()
    assert [c[:2] for c in commands] == [[".venv/bin/soakmatrix", "bisect"]] * 2 + [[".venv/bin/soakmatrix", "report"]]
    (tmp_path / "out" / "demo").mkdir(parents=True)
    demo_store(tmp_path / "out" / "demo" / "history.sqlite")

    def run(command: list[str]) -> subprocess.CompletedProcess:
        # the repository's example files, the demo's output folder under tmp_path
        args = [str(REPO / a) if a.startswith("matrix/") else a for a in command[1:]]
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)

    flags, builds, report = (run(c) for c in commands)
    assert flags.returncode == 1, flags.stderr[-2000:]
    assert "minimal set: cudagraph_mode=FULL_AND_PIECEWISE, mtp=1" in flags.stdout
    assert "from the history store" in flags.stdout             # the demo's hang names the target
    assert builds.returncode == 1, builds.stderr[-2000:]
    assert "first bad build: nightly-1105, last good nightly-1104" in builds.stdout, builds.stdout
    assert report.returncode == 0, report.stderr[-2000:]
    page = (tmp_path / "out" / "demo" / "dashboard" / "index.html").read_text()
    # the set the bisection printed, not the whole config it hangs in
    assert "smallest flag set that still hangs: <b>cudagraph_mode=FULL_AND_PIECEWISE,mtp=1</b>" in page
