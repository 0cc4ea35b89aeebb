"""Builds end to end, simulated (issue 21 items 1, 2 and the simulated half of 5): three builds of the
simulated engine, switched per cell by Ray's runtime_env (`py_executable`: no install), with a hang
model that plants a hang from the second build on. Through the real CLI on a local Ray cluster, the
run's JUnit and history show the regression: last good build 0, first bad build 1."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from tests.conftest import REPO

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.reports.history import HistoryStore
from soakmatrix.reports.regressions import find_regressions, rows_of

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]

MATRIX = """\
name: builds-e2e
models: {{m: {{path: org/m}}}}
gpus: {{H200: {{count: 2, memory_gb: 141, ray_label: H200}}}}
workloads: {{steady: {{kind: random, concurrency: 4}}}}
builds:
  b0: {{python: {python}}}
  b1: {{python: {python}}}
  b2: {{python: {python}}}
profiles: {{p: {{soak: 20m, startup: 5s, workloads: [steady], retries: 0}}}}
sim: {{hang_model: hangs.yaml, time_scale: 240}}
"""

HANGS = """\
seed: 21
hangs:
  - {id: regression, style: silent_stall, mttf_s: 60, when: {build: [1, b2]}}
"""


def assert_no_server_left(out: Path) -> None:
    """No simulated server of this run is left (their command lines name the output folder)."""
    def left() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if str(out) in " ".join(p.info["cmdline"] or []):
                    found.append(p)
            except psutil.Error:
                continue
        return found
    psutil.wait_procs(left(), timeout=30)
    assert left() == []


def write(folder: Path) -> Path:
    (folder / "hangs.yaml").write_text(HANGS)
    path = folder / "builds.yaml"
    path.write_text(MATRIX.format(python=sys.executable))
    return path


def test_plan_shows_each_build_and_its_runtime_env(tmp_path):
    out = subprocess.run([*CLI, "plan", str(write(tmp_path)), "--no-validate"], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert f"  1  b1  python: {sys.executable}" in out.stdout
    assert "m|H200||steady|b2" in out.stdout and "3 cells" in out.stdout


@pytest.mark.slow
def test_a_hang_planted_from_the_second_build_on_is_a_regression_in_junit_and_history(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([*CLI, "run", str(write(tmp_path)), "--out", str(out)], capture_output=True, text=True,
                          timeout=500, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr   # hangs were found
    with HistoryStore(out / "history.sqlite") as store:
        results = {r.build: r for r in store.results(store.latest_run_id())}
        rows = rows_of(store)
    assert results["b0"].outcome is Outcome.PASSED, results["b0"].message
    assert results["b1"].outcome is Outcome.HANG and results["b2"].outcome is Outcome.HANG
    assert [results[b].build_ordinal for b in ("b0", "b1", "b2")] == [0, 1, 2]
    (reg,) = find_regressions(rows)
    assert (reg.last_good, reg.first_bad, reg.untested) == ("b0", "b1", ())
    assert reg.good_mttf_lower_s > reg.bad_mttf_s
    cases = {c.get("name"): c for c in ET.parse(out / "junit.xml").getroot().iter("testcase")}
    assert set(cases) == {f"m|H200||steady|{b}" for b in ("b0", "b1", "b2")}
    props = {name: {p.get("name"): p.get("value") for p in case.iter("property")} for name, case in cases.items()}
    bad = props["m|H200||steady|b1"]
    assert bad["build"] == "b1" and bad["regression.last_good"] == "b0" and bad["regression.first_bad"] == "b1"
    assert bad["regression"].startswith("last good b0, first bad b1;")
    assert props["m|H200||steady|b2"]["regression.first_bad"] == "b1"
    assert props["m|H200||steady|b0"]["build"] == "b0" and "regression" not in props["m|H200||steady|b0"]
    assert bad["build.python"] == results["b1"].python == sys.executable   # the python: build's interpreter
    page = (out / "dashboard" / "index.html").read_text()
    assert 'id="regressions"' in page and "<td>b0</td><td>b1</td>" in page
    assert_no_server_left(out)


@pytest.mark.slow
def test_a_python_build_missing_on_the_nodes_is_a_config_error_not_a_wait(tmp_path):
    path = write(tmp_path)
    path.write_text(path.read_text().replace(f"b2: {{python: {sys.executable}}}", "b2: {python: /nonexistent/bin/python3}"))
    out = tmp_path / "out"
    proc = subprocess.run([*CLI, "run", str(path), "--out", str(out)], capture_output=True, text=True,
                          timeout=500, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with HistoryStore(out / "history.sqlite") as store:
        results = {r.build: r for r in store.results(store.latest_run_id())}
    assert results["b2"].outcome is Outcome.CONFIG_ERROR
    assert "/nonexistent/bin/python3" in results["b2"].message and "py_executable" in results["b2"].message
    assert_no_server_left(out)
