"""`soakmatrix bisect --builds ... --store FILE`: the history's results of the failing cell on listed
builds enter the build bisection as known evidence (issue 21, "history known evidence into build
bisection"); only hangs of the target signature count, other cells and other builds not at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from soakmatrix.matrix.build_bisect import history as hist
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.history import HistoryStore

from tests.conftest import REPO

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]
NAMES = [f"b{i}" for i in range(6)]
CELL = "m|H200||steady|b5"

MATRIX = """\
name: build-bisect-history
models: {m: {path: org/m}}
gpus: {H200: {count: 2, memory_gb: 141, ray_label: H200}}
workloads: {steady: {kind: random, concurrency: 4}}
builds:
""" + "".join(f"  b{i}: {{pip: vllm==0.{10 + i}.0}}\n" for i in range(6)) + """\
profiles: {p: {soak: 20m, startup: 10m, workloads: [steady], retries: 0}}
sim: {hang_model: hangs.yaml}
"""

HANGS = """\
seed: 5
hangs:
  - {id: regression, style: silent_stall, mttf_s: 2280, when: {build: [b3, b4, b5]}}
"""


def result(build: str, outcome: Outcome, exposure_s: float, signature: str | None = None,
           model: str = "m", flags: dict | None = None) -> CellResult:
    return CellResult(cell_id=f"id-{build}", cell_name=f"{model}|H200||steady|{build}", outcome=outcome, model=model,
                      gpu_type="H200", workload="steady", flags=dict(flags or {}), signature=signature,
                      exposure_s=exposure_s, time_to_hang_s=exposure_s if outcome is Outcome.HANG else None,
                      build=build, build_ordinal=int(build[1:]))


HISTORY = [
    result("b0", Outcome.PASSED, 40_000.0),
    result("b1", Outcome.PASSED, 30_000.0),
    result("b1", Outcome.HANG, 500.0, "shm_broadcast_timeout"),   # another signature: exposure only
    result("b2", Outcome.PASSED, 20_000.0),
    result("b2", Outcome.INFRA_ERROR, 9_000.0),                   # says nothing
    result("b5", Outcome.HANG, 1_000.0, "silent_stall"),
    result("b5", Outcome.HANG, 3_000.0, "silent_stall"),
    result("b4", Outcome.HANG, 700.0, "silent_stall", model="other"),                 # another cell
    result("b3", Outcome.HANG, 700.0, "silent_stall", flags={"tp": 2}),               # another cell
]


def test_evidence_pools_the_cells_results_per_listed_build_and_counts_only_the_target():
    extra = result("b9", Outcome.HANG, 10.0, "silent_stall")   # a build not in the list
    mine = hist.cell_results([*HISTORY, extra], "m", "H200", {}, "steady", NAMES)
    assert len(mine) == 7
    assert hist.newest_signature(mine) == "silent_stall"
    e = hist.evidence(mine, NAMES, "silent_stall", "h.sqlite")
    assert e.known == {0: (0, 40_000.0), 1: (0, 30_500.0), 2: (0, 20_000.0), 5: (2, 4_000.0)}
    assert (e.results, e.other_hangs, e.target_hangs) == (6, 1, 2)
    other = hist.evidence(mine, NAMES, "shm_broadcast_timeout", "h.sqlite")
    assert other.known[1] == (1, 30_500.0) and other.known[5] == (0, 4_000.0) and other.other_hangs == 2


def write(folder: Path, history: list[CellResult]) -> tuple[Path, Path, Path]:
    (folder / "hangs.yaml").write_text(HANGS)
    (folder / "matrix.yaml").write_text(MATRIX)
    (folder / "builds.txt").write_text("".join(f"{n}\n" for n in NAMES))
    store = folder / "history.sqlite"
    with HistoryStore(store) as s:
        for r in history:   # one night each: a store keeps one result per cell and run
            run = s.start_run(matrix="build-bisect-history", profile="p")
            s.record(run, r)
            s.finish_run(run, "done")
    return folder / "matrix.yaml", folder / "builds.txt", store


def bisect(matrix: Path, builds: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "bisect", str(matrix), "--cell", CELL, "--builds", str(builds), "--virtual",
                           "--seed", "4", "--quiet", *extra], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.slow   # the CLI as a subprocess
def test_history_enters_the_virtual_build_bisection_and_the_report_says_how_much(tmp_path):
    matrix, builds, store = write(tmp_path, HISTORY)
    proc = bisect(matrix, builds, "--json", "--store", str(store))
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["first_bad"], doc["signature"]) == ("b3", "silent_stall"), doc   # the target from the history
    h = doc["history"]
    assert (h["results"], h["target_hangs"], h["other_hangs"]) == (6, 2, 1)
    assert h["builds"]["b5"] == {"hangs": 2, "exposure_s": 4000.0} and "b3" not in h["builds"]
    rows = {b["build"]: b for b in doc["builds"]}
    # two target hangs of the bad build were on record: no calibration soak was needed
    assert "calibration" not in doc["gpu_hours_by_role"] and rows["b5"]["probes"] == 0 and rows["b5"]["hangs"] == 2
    assert rows["b0"]["exposure_s"] >= 40_000 and rows["b1"]["hangs"] == 0
    text = bisect(matrix, builds, "--store", str(store))
    assert text.returncode == 1, text.stderr
    assert "from history: 6 result(s) of this cell on 4 listed build(s): 2 hang(s) of silent_stall" in text.stdout
    without = json.loads(bisect(matrix, builds, "--json").stdout)
    assert "history" not in without and without["gpu_hours_by_role"]["calibration"] > 0


@pytest.mark.slow   # the CLI as a subprocess
def test_a_store_without_the_cell_adds_nothing_and_says_so(tmp_path):
    matrix, builds, store = write(tmp_path, [r for r in HISTORY if r.model != "m"])
    proc = bisect(matrix, builds, "--store", str(store))
    assert proc.returncode == 1, proc.stderr
    assert "from history: no result of this cell on the listed builds" in proc.stdout
    assert "first bad build: b3" in proc.stdout
