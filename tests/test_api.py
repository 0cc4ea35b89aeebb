"""The Python API through its public names only (`from soakmatrix import ...`), on the paths of
docs/examples/api_tour.py: plan a matrix, run it on a local Ray cluster, bisect flags in virtual
time, watch a simulated server; and importing the package stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import soakmatrix
from soakmatrix import (
    BisectOptions,
    CellEvent,
    CellResult,
    FlagBisection,
    Outcome,
    RunResult,
    SpecError,
    UsageError,
    WatchResult,
    bisect_flags,
    load_matrix,
    plan,
    run,
    simulated_server,
    watch,
)

REPO = Path(__file__).resolve().parent.parent
TOUR = REPO / "docs" / "examples" / "tour.yaml"
DEMO = REPO / "matrix" / "examples" / "demo.yaml"
FAILING = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"
HEAVY = ("ray", "plotly", "scipy", "numpy", "jinja2")


def test_import_soakmatrix_is_light_and_every_public_name_resolves():
    code = ("import sys, soakmatrix\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
            "ours = sorted(m for m in sys.modules if m.startswith('soakmatrix.') and m != 'soakmatrix._version')\n"
            "from soakmatrix import load_matrix, plan, run, watch, RunResult, BisectOptions, CellResult\n"
            "heavy_after = sorted(m for m in sys.modules if m.split('.')[0] in {'ray', 'plotly', 'scipy'})\n"
            "print(heavy, ours, heavy_after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] [] []", out.stdout
    assert all(getattr(soakmatrix, name) is not None for name in soakmatrix.__all__)
    assert set(soakmatrix.__all__) <= set(dir(soakmatrix))
    assert soakmatrix.__all__ == ["__version__", *soakmatrix._EXPORTS]


def test_load_and_plan_the_tour_matrix():
    matrix = load_matrix(TOUR)
    planned = plan(matrix)
    assert planned.profile.name == "quick" and [c.name for c in planned.cells] == [
        "tiny-moe|H200|mtp=0|steady", "tiny-moe|H200|mtp=1|steady"]
    assert plan(str(TOUR), "quick").cells == planned.cells            # a path is a matrix too
    with pytest.raises(SpecError) as err:
        load_matrix(TOUR, text=TOUR.read_text().replace("count: 8", "count: zero"))
    assert "gpus.H200.count" in str(err.value)


def test_bisect_flags_in_virtual_time_finds_the_planted_set_and_records_it(tmp_path):
    store = tmp_path / "history.sqlite"
    seen: list[FlagBisection] = []
    progress: list[str] = []
    answer = bisect_flags(DEMO, FAILING, options=BisectOptions(virtual=True, seed=3), shrink=False,
                          store=str(store), emit_test=str(tmp_path / "test_regression.py"),
                          progress=progress.append, on_result=seen.append)
    assert isinstance(answer, FlagBisection) and seen and seen[0].status == answer.status == "found"
    assert answer.exit_code == 1 and set(answer.minimal_set) == {"mtp", "cudagraph_mode"}
    assert answer.signature == "shm_broadcast_timeout" and answer.warnings == ()
    assert answer.doc["status"] == "found" and json.dumps(answer.doc, default=str)
    assert answer.text.startswith(f"cell {answer.cell.id}") and progress
    assert (tmp_path / "test_regression.py").exists() and store.exists()
    with pytest.raises(UsageError, match="no cell 'nope'"):
        bisect_flags(DEMO, "nope", virtual=True)
    with pytest.raises(TypeError, match="no_such_option"):
        bisect_flags(DEMO, FAILING, virtual=True, no_such_option=1)


def test_a_result_json_written_with_a_free_form_extra_dict_still_loads():
    old = {"cell_id": "c1", "cell_name": "m|g|tp=2|w", "outcome": "hang", "signature": "shm_broadcast_timeout",
           "exposure_s": 600.0, "extra": {"ray_node_id": "n1", "startup_s": 4.5, "causes": ["mtp x cudagraph"],
                                          "verdict": {"detector": "token_progress", "at": 12.0},
                                          "teardown": {"clean": True, "pids": [7]}, "url": "http://h:1", "pid": 7,
                                          "regression": {"regression.last_good": "b0"}, "gone": "dropped"}}
    r = CellResult.from_json(json.dumps(old))
    assert r.outcome is Outcome.HANG and r.ray_node_id == "n1" and r.startup_s == 4.5
    assert r.causes == ["mtp x cudagraph"] and r.verdict["detector"] == "token_progress"
    assert r.teardown["pids"] == [7] and (r.url, r.pid) == ("http://h:1", 7)
    assert r.regression == {"regression.last_good": "b0"}
    again = CellResult.from_json(r.to_json())
    assert again == r and "extra" not in json.loads(r.to_json())


@pytest.mark.slow
def test_watch_a_simulated_server_briefly(tmp_path):
    notes: list[str] = []
    with simulated_server(log=tmp_path / "sim.log") as server:
        watched = watch(server.url, duration_s=3, canary_every_s=0.5, out=tmp_path / "incidents",
                        on_note=notes.append)
    assert isinstance(watched, WatchResult) and watched.exit_code == 0 and watched.incidents == ()
    assert watched.notes == tuple(notes) and notes[0].startswith("watching ") and "0 incident" in notes[-1]
    with pytest.raises(UsageError, match="--ceiling"):
        watch("http://127.0.0.1:9", floor_s=10, ceiling_s=5)


@pytest.mark.slow
def test_run_a_tiny_matrix_on_a_local_ray_cluster_with_a_progress_callback(tmp_path):
    events: list[CellEvent] = []
    with open(tmp_path / "progress.log", "w") as log:
        result = run(TOUR, out=tmp_path / "out", progress=events.append, log=log)
    assert isinstance(result, RunResult) and result.exit_code == 0, (tmp_path / "progress.log").read_text()
    assert [r.outcome for r in result.results] == [Outcome.PASSED, Outcome.PASSED] and result.findings == ()
    assert result.junit is not None and result.junit.exists() and result.store.exists()
    assert result.run_id and not result.interrupted and not result.lost and not result.unreachable
    finished = [e for e in events if e.kind == "finished"]
    assert sorted(e.cell.name for e in finished) == ["tiny-moe|H200|mtp=0|steady", "tiny-moe|H200|mtp=1|steady"]
    assert all(e.result.ray_node_id for e in finished)
    assert {e.kind for e in events} >= {"started", "finished"}


@pytest.mark.slow
def test_the_tour_runs(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "docs" / "examples" / "api_tour.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run: exit 0, 2 results" in out.stdout and "bisect: found" in out.stdout
    assert "watch: exit 0, 0 incident(s)" in out.stdout
