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

pytestmark = pytest.mark.slow   # every test runs `soakmatrix report` as a subprocess

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


def test_known_issues_name_the_findings_in_the_table_junit_and_a_finding_page(tmp_path):
    path = tmp_path / "history.sqlite"
    cell = CELLS[1]
    with HistoryStore(path) as s:
        run = s.start_run(matrix="nightly.yaml", profile="nightly")
        s.record(run, CellResult(
            cell_id=cell.id, cell_name=cell.name, outcome="hang", model=cell.model, gpu_type=cell.gpu,
            workload=cell.workload, flags={"tp": 8, "mtp": 1, "cudagraph_mode": "FULL_AND_PIECEWISE"},
            exposure_s=900.0, time_to_hang_s=900.0, signature="shm_broadcast_timeout", fingerprint="abcdef012345",
            culprit="Worker_TP2 MainThread: NCCL/gloo collective", stuck_frames=["ncclKernel_AllReduce (libnccl.so.2)"],
            threads=[{"role": "Worker_TP2", "thread": "MainThread", "kind": "culprit", "reason": "NCCL/gloo collective",
                      "frames": ["ncclKernel_AllReduce (libnccl.so.2)"]}], log_tail=["<script>x</script>"]))
        s.finish_run(run, "found")
    example = Path(__file__).resolve().parent.parent / "matrix" / "examples" / "known_issues.yaml"
    done = soakmatrix("report", str(path), "--known-issues", str(example), "--out", "site", "--junit", "j.xml",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "abcdef012345  shm_broadcast_timeout     1      1       1" in done.stdout and "vllm-42271" in done.stdout
    assert "Worker_TP2 MainThread: NCCL/gloo collective" in done.stdout
    page = (tmp_path / "site" / "findings" / "abcdef012345.html").read_text()
    assert "ncclKernel_AllReduce" in page and "github.com/vllm-project/vllm/issues/42271" in page
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page
    assert 'href="findings/abcdef012345.html"' in (tmp_path / "site" / "index.html").read_text()
    [case] = [c for s in xunit2.JUnitXml.fromfile(str(tmp_path / "j.xml")) for c in s]
    assert {p.name: p.value for p in case.properties()}["known_issue.id"] == "vllm-42271"


def test_a_broken_known_issues_file_exits_2_naming_file_line_and_key(store, tmp_path):
    path, _ = store
    bad = tmp_path / "known.yaml"
    bad.write_text("known_issues:\n  - id: x\n    title: t\n    match: {frames: ['(']}\n")
    done = soakmatrix("report", str(path), "--known-issues", str(bad), cwd=tmp_path)
    assert done.returncode == 2 and f"{bad}:4: known_issues[0].match.frames[0]: not a regular expression" in done.stderr
