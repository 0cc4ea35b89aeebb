"""`soakmatrix bisect --builds` on real builds (issue 21 items 3 and 5, simulated): without
`--virtual`, each probe is a soak job of the failing cell on one build, the simulated engine
switched per probe by Ray's runtime_env (`py_executable`: every build is this interpreter under its
own name, so nothing is installed) on a local Ray cluster; the engine reads its build from the
environment, so a hang model planting the hang from one build on holds in scaled real time.

Through the real CLI: the planted first bad build is named; a build whose interpreter is not on the
nodes is untestable, never bad; nothing is left running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]

# six builds of the simulated engine, the hang planted from b3 on (MTTF 10 minutes: 2.5 s of wall time
# at 4 minutes of load per second, well above the second or so a probe's load takes to start and drain)
MATRIX = """\
name: build-bisect-soak
models: {{m: {{path: org/m}}}}
gpus: {{H200: {{count: 2, memory_gb: 141, ray_label: H200}}}}
workloads: {{steady: {{kind: random, concurrency: 4}}}}
builds:
{builds}
profiles: {{p: {{soak: 20m, startup: 5s, workloads: [steady], retries: 0}}}}
sim: {{hang_model: hangs.yaml, time_scale: 240}}
"""

HANGS = """\
seed: 21
hangs:
  - {id: regression, style: silent_stall, mttf_s: 600, when: {build: [b3, b4, b5]}}
"""


def write(folder: Path, builds: dict[str, str]) -> Path:
    (folder / "hangs.yaml").write_text(HANGS)
    path = folder / "matrix.yaml"
    path.write_text(MATRIX.format(builds="\n".join(f"  {name}: {{python: {py}}}" for name, py in builds.items())))
    return path


def bisect(matrix: Path, cell: str, builds_file: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "bisect", str(matrix), "--cell", cell, "--builds", str(builds_file), "--json",
                           "--confidence", "0.9", "--seed", "3", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=480, cwd=REPO)


def assert_nothing_left(before: set[int], folder: Path) -> None:
    """No process started since `before` still names the test's folder (a server, a Ray worker)."""
    def left() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.info["pid"] not in before and str(folder) in " ".join(p.info["cmdline"] or []):
                    found.append(p)
            except psutil.Error:
                continue
        return found
    time.sleep(1)
    psutil.wait_procs(left(), timeout=30)
    assert left() == []


@pytest.mark.slow
def test_probes_of_real_builds_through_ray_name_the_planted_first_bad_build(tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    names = [f"b{i}" for i in range(6)]
    matrix = write(tmp_path, {n: sys.executable for n in names})
    builds_file = tmp_path / "builds.txt"
    builds_file.write_text("".join(f"{n}\n" for n in names))   # the matrix's builds, by name
    proc = bisect(matrix, "m|H200||steady|b5", builds_file, tmp_path / "out")
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "found" and doc["oracle"] == "soak (sim)"
    assert (doc["last_good"], doc["first_bad"]) == ("b2", "b3"), doc
    assert doc["signature"] == "silent_stall"
    rows = {b["build"]: b for b in doc["builds"]}
    assert rows["b3"]["hangs"] >= 1 and rows["b2"]["hangs"] == 0 and rows["b2"]["exposure_s"] > 0
    # every probe was a soak job on its build: its result says which, and its engine ran under it
    results = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("probe-*/cells/*/result.json")]
    assert len(results) == doc["probes"]
    assert {r["build"] for r in results} <= set(names) and "b3" in {r["build"] for r in results}
    assert "probe 1: build b5" in proc.stderr and "local Ray" in proc.stderr
    assert_nothing_left(before, tmp_path)


@pytest.mark.slow
def test_a_build_that_cannot_start_is_untestable_not_bad(tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    builds = {f"b{i}": sys.executable for i in range(5)}
    builds["b2"] = str(tmp_path / "missing" / "bin" / "python3")
    # a matrix without builds: the list's lines are build specs of their own, the hang model given apart
    matrix = write(tmp_path, {})
    matrix.write_text(matrix.read_text().replace("hang_model: hangs.yaml, ", ""))
    builds_file = tmp_path / "builds.txt"
    builds_file.write_text("".join(f"{name}: python:{py}\n" for name, py in builds.items()))
    proc = bisect(matrix, "m|H200||steady", builds_file, tmp_path / "out", "--hang-model",
                  str(tmp_path / "hangs.yaml"), "--signature", "silent_stall")
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    rows = {b["build"]: b for b in doc["builds"]}
    assert doc["untestable"] == ["b2"] and rows["b2"]["hangs"] == 0 and rows["b2"]["untestable"]
    # the change is in (b1, b3]: b3 itself, or b2 that could not be tested
    assert doc["status"] in ("found", "range") and doc["last_good"] == "b1", doc
    assert doc["first_bad"] == "b3" or doc["range"] == ["b2", "b3"], doc
    assert "build b2: untestable (config_error)" in proc.stderr and "missing/bin/python3" in proc.stderr
    assert_nothing_left(before, tmp_path)
