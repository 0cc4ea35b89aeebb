"""`soakmatrix bisect` through the real CLI: virtual time on the demo matrix, and (slow) the same
cell on the simulated engine through Ray and soak jobs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import EXAMPLES, REPO

DEMO = EXAMPLES / "demo.yaml"
FAILING = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"


def soakmatrix(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_virtual_bisect_of_the_demo_cell_finds_mtp_and_cudagraph(tmp_path):
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--seed", "3",
                     "--emit-test", str(tmp_path / "test_regression.py"))
    assert out.returncode == 1, out.stderr          # a hang was found and isolated
    doc = json.loads(out.stdout)
    assert doc["status"] == "found"
    assert sorted(doc["minimal"]) == ["cudagraph_mode", "mtp"]
    assert doc["signature"] == "shm_broadcast_timeout"
    kinds = {v["flag"]: v["kind"] for v in doc["verdicts"]}
    assert kinds["mtp"] == kinds["cudagraph_mode"] == "necessary"
    assert kinds["async_scheduling"] != "necessary" and kinds["tp"] != "necessary"
    assert doc["gpu_hours"] > 0 and doc["probes"] >= 4
    assert doc["failing"]["hangs"] >= 2 and doc["failing"]["low_s"] < doc["failing"]["high_s"]
    # configs that never hung are bounds, never "never"
    assert all("never" not in c["mttf"] for c in doc["configs"])
    assert any(c["mttf"].startswith(">") for c in doc["configs"])
    test_file = (tmp_path / "test_regression.py").read_text()
    tree = ast.parse(test_file)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    mark = fn.decorator_list[0]
    kw = {k.arg: ast.literal_eval(k.value) for k in mark.keywords}
    assert kw["flags"]["mtp"] == 1 and kw["flags"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert kw["flags"]["async_scheduling"] is False          # back at the baseline
    assert kw["engine"] == "sim" and kw["expect"] == "pass" and kw["duration"] > 600
    assert kw["gpu_type"] == "H200" and kw["hang_model"].endswith("demo.yaml")


def test_text_table_by_cell_id():
    plan = json.loads(soakmatrix("plan", str(DEMO), "--json", "--no-validate").stdout)
    cell_id = next(c["id"] for c in plan["cells"] if c["name"] == FAILING)
    out = soakmatrix("bisect", str(DEMO), "--cell", cell_id, "--virtual", "--quiet", "--no-shrink")
    assert out.returncode == 1, out.stderr
    assert "minimal set: cudagraph_mode=FULL_AND_PIECEWISE, mtp=1" in out.stdout
    assert "necessary" in out.stdout and "GPU-hours" in out.stdout


def test_usage_errors_name_the_problem():
    out = soakmatrix("bisect", str(DEMO), "--cell", "nope", "--virtual")
    assert out.returncode == 2 and "no cell 'nope'" in out.stderr
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--confidence", "1.5")
    assert out.returncode == 2 and "--confidence" in out.stderr
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--mttf-cap", "soon")
    assert out.returncode == 2 and "--mttf-cap" in out.stderr
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--modifier-prior", "1")
    assert out.returncode == 2 and "--modifier-prior" in out.stderr and "below 1" in out.stderr


def test_a_cell_that_does_not_hang_is_not_reproduced():
    cell = "tiny-moe|H200|async_scheduling=false,cudagraph_mode=FULL_DECODE_ONLY,mtp=0,tp=1|staggered"
    out = soakmatrix("bisect", str(DEMO), "--cell", cell, "--virtual", "--quiet", "--mttf-cap", "10m")
    assert out.returncode == 0
    assert "not_reproduced" in out.stdout and "MTTF >" in out.stdout


@pytest.mark.slow
def test_sim_engine_on_ray_gives_the_virtual_answer(tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--json", "--backend", "sim", "--no-shrink",
                     "--confidence", "0.9", "--parallel", "2", "--out", str(tmp_path / "out"), timeout=1500)
    assert out.returncode == 1, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert sorted(doc["minimal"]) == ["cudagraph_mode", "mtp"]
    assert doc["oracle"] == "soak (sim)"
    # nothing of this run is left: no process still mentions its output folder
    time.sleep(2)
    leftovers = [p for p in psutil.process_iter(["pid", "cmdline"])
                 if p.info["pid"] not in before and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers


@pytest.mark.slow
def test_emitted_regression_test_runs_under_the_soak_plugin_and_catches_the_hang(tmp_path):
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--quiet", "--seed", "3", "--no-shrink",
                     "--emit-test", str(tmp_path / "test_regression.py"))
    assert out.returncode == 1, out.stderr
    # the bug is still planted in the simulated engine, so the regression test must fail with its signature
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_regression.py")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-2000:]
    assert "shm_broadcast_timeout" in run.stdout


def test_store_records_the_bisection_for_the_dashboard(tmp_path):
    store = tmp_path / "history.sqlite"
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--quiet", "--no-shrink", "--seed", "3",
                     "--store", str(store))
    assert out.returncode == 1, out.stderr
    from soakmatrix.reports.history import HistoryStore

    with HistoryStore(store) as history:
        (report,) = history.bisections()
    assert report["cell"]["name"] == FAILING
    assert sorted(report["minimal"]) == ["cudagraph_mode", "mtp"]
    dashboard = soakmatrix("report", str(store), "--out", str(tmp_path / "site"))
    assert dashboard.returncode == 0, dashboard.stderr
    page = (tmp_path / "site" / "index.html").read_text()
    assert "cudagraph_mode" in page and "necessary" in page
