"""`soakmatrix report` end to end, through the real CLI: tables, dashboard, JUnit, merge, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema
from junitparser import xunit2

from soakmatrix.matrix.cells import Cell
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.history import HistoryStore

EXTENDED_XSD = Path(__file__).parent / "data" / "junit-10-testcase-properties.xsd"
CELLS = [Cell.make("zai-org/GLM-5.1", "H200", {"tp": 8, "mtp": m}, "chat") for m in (0, 1, 2)]
NIGHTS = ["PHP", "PPH", "XXX"]   # per cell: one letter per night


def soakmatrix(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def store(tmp_path) -> tuple[Path, list[str]]:
    path = tmp_path / "history.sqlite"
    outcomes = {"P": "passed", "H": "hang", "X": "config_error"}
    runs = []
    with HistoryStore(path) as s:
        for night in range(3):
            run = s.start_run(matrix="nightly.yaml", profile="nightly", meta={"git": f"c{night}"})
            for cell, letters in zip(CELLS, NIGHTS):
                outcome = outcomes[letters[night]]
                s.record(run, CellResult(
                    cell_id=cell.id, cell_name=cell.name, outcome=outcome, model=cell.model, gpu_type=cell.gpu,
                    workload=cell.workload, flags=cell.flag_dict, exposure_s=3600.0 if outcome != "config_error" else 0.0,
                    signature="shm_broadcast_timeout" if outcome == "hang" else None,
                    time_to_hang_s=1500.0 if outcome == "hang" else None, detector="token_progress" if outcome == "hang" else None,
                    message="tokens stopped 25 min in" if outcome == "hang" else "", log_tail=["<script>x</script>"],
                    started_at=1_790_000_000.0 + night * 86_400, ended_at=1_790_000_000.0 + night * 86_400 + 3700))
            s.finish_run(run, "found")
            runs.append(run)
    return path, runs


def test_report_prints_runs_states_and_signatures(store, tmp_path):
    path, runs = store
    done = soakmatrix("report", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert all(run in out for run in runs)
    assert f"flaky                 {CELLS[0].id}" in out and ".H." in out      # hung on night 2 only
    assert f"failing               {CELLS[1].id}" in out and "..H" in out      # new on night 3
    assert f"consistently_failing  {CELLS[2].id}" in out and "XXX" in out      # flags refused every night
    assert "shm_broadcast_timeout  hang        2      2" in out


def test_report_writes_dashboard_and_junit_of_the_latest_run(store, tmp_path):
    path, runs = store
    done = soakmatrix("report", str(path), "--out", "site", "--junit", "out/junit.xml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").stat().st_size > 4_000_000     # plotly inlined
    xml = xunit2.JUnitXml.fromfile(str(tmp_path / "out" / "junit.xml"))
    [suite] = list(xml)
    assert (suite.tests, suite.failures, suite.errors) == (3, 1, 1)
    assert {p.name: p.value for p in suite.properties()}["run_id"] == runs[-1]
    xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(str(tmp_path / "out" / "junit.xml"))


def test_report_junit_of_a_chosen_run_and_merge(store, tmp_path):
    path, runs = store
    for i, run in enumerate(runs[:2]):
        done = soakmatrix("report", str(path), "--run", run, "--junit", f"shard{i}.xml", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    done = soakmatrix("report", "--merge", "shard0.xml", "shard1.xml", "-o", "merged/all.xml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "3 test cases" in done.stdout
    merged = xunit2.JUnitXml.fromfile(str(tmp_path / "merged" / "all.xml"))
    cases = {c.name: c for s in merged for c in s}
    assert set(cases) == {c.name for c in CELLS}
    assert cases[CELLS[0].name].is_failure       # passed night 1, hung night 2: the later shard's verdict wins
    assert cases[CELLS[2].name].is_error
    xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(str(tmp_path / "merged" / "all.xml"))


@pytest.mark.parametrize("args, message", [
    (["report", "missing.sqlite"], "missing.sqlite: no such history store"),
    (["report"], "give a history store"),
    (["report", "--merge", "a.xml"], "--merge needs -o OUT.xml"),
    (["report", "--merge", "broken.xml", "-o", "m.xml"], "broken.xml:1:"),
    (["report", "STORE", "--run", "nope"], "no run 'nope'"),
])
def test_usage_errors_exit_2_and_say_what_is_wrong(store, tmp_path, args, message):
    path, _ = store
    (tmp_path / "broken.xml").write_text("<testsuites><testsuite></testsuites>")
    args = [str(path) if a == "STORE" else a for a in args]
    done = soakmatrix(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "missing.sqlite").exists()
