"""A `pip:` build through Ray's runtime_env, end to end (matrix `builds:`, issue 21 item 1).

`soakmatrix run` on a local Ray cluster with two pip builds of the simulated engine's cell: one is a
wheel built here (Ray installs it into a virtualenv of its own and the soak job runs there, which its
result says), the other a wheel path that does not exist (Ray cannot set it up: a config error of that
build, never a hang). No network: the wheel is a local file. Slow: Ray builds a virtualenv per build
(about 25 s here), and the broken one fails after pip's attempt.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.conftest import REPO

from soakmatrix.matrix.contracts.outcomes import EXIT_USAGE, Outcome
from soakmatrix.matrix.schedule.cluster import KEEP_RUNTIME_ENVS_ENV
from soakmatrix.reports.history import HistoryStore

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]

MATRIX = """\
name: pip-builds
models: {{m: {{path: org/m}}}}
gpus: {{H200: {{count: 2, memory_gb: 141, ray_label: H200}}}}
workloads: {{steady: {{kind: random, concurrency: 4}}}}
builds:
  marked: {{pip: {wheel}, setup_timeout: 4m}}
  missing: {{pip: {missing}, setup_timeout: 4m}}
profiles: {{p: {{soak: 10m, startup: 5s, workloads: [steady], retries: 0}}}}
sim: {{time_scale: 240}}
"""


def write_wheel(folder: Path, name: str = "soakmarker", version: str = "1.2.3") -> Path:
    """A pure-Python wheel with one module, written by hand: no build backend, no network."""
    files = {f"{name}/__init__.py": 'WHERE = "a pip build"\n',
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: soakmatrix-tests\n"
                                                  "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(text)}")
        record_path = f"{name}-{version}.dist-info/RECORD"
        wheel.writestr(record_path, "\n".join([*record, f"{record_path},,"]) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pip_build_soaks_in_rays_virtualenv_and_one_ray_cannot_install_is_a_config_error(tmp_path):
    wheel = write_wheel(tmp_path)
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(MATRIX.format(wheel=wheel, missing=tmp_path / "missing-1.0-py3-none-any.whl"))
    out = tmp_path / "out"
    # Ray tries a failed setup 3 times by default (RUNTIME_ENV_RETRY_TIMES); once says the same here.
    # The build's virtualenv is kept after the run (it goes with the cluster otherwise: test_cluster.py)
    # so this test can look inside it; the test removes it itself.
    env = {**os.environ, "RUNTIME_ENV_RETRY_TIMES": "1", KEEP_RUNTIME_ENVS_ENV: "1"}
    proc = subprocess.run([*CLI, "run", str(matrix), "--out", str(out)], capture_output=True, text=True,
                          timeout=540, cwd=REPO, env=env)
    assert proc.returncode == EXIT_USAGE, proc.stderr[-3000:]
    with HistoryStore(out / "history.sqlite") as store:
        results = {r.build: r for r in store.results(store.latest_run_id())}
    assert set(results) == {"marked", "missing"}, proc.stderr[-3000:]

    marked = results["marked"]
    assert marked.outcome is Outcome.PASSED and marked.exposure_s > 0
    # the soak job ran in the virtualenv Ray made for the build, not in this interpreter
    assert marked.python and Path(marked.python) != Path(sys.executable)
    assert "runtime_resources" in marked.python and "pip" in Path(marked.python).parts
    runtime_resources = next(p for p in Path(marked.python).parents if p.name == "runtime_resources")
    try:
        (job_result,) = out.glob("**/cells/*/result.json")           # the job's own record says so too
        assert json.loads(job_result.read_text())["python"] == marked.python
        site = subprocess.run([marked.python, "-c", "import soakmarker, sys; print(soakmarker.WHERE)"],
                              capture_output=True, text=True, timeout=60)
        assert site.stdout.strip() == "a pip build"      # the wheel is installed there, and only there
        mine = subprocess.run([sys.executable, "-c", "import soakmarker"], capture_output=True, timeout=60)
        assert mine.returncode != 0
    finally:
        shutil.rmtree(runtime_resources, ignore_errors=True)   # a clone of this environment: GBs with vLLM

    missing = results["missing"]
    assert missing.outcome is Outcome.CONFIG_ERROR and missing.exposure_s == 0
    assert missing.message.startswith("build missing: Ray could not set up its runtime_env")
    assert "No such file" in missing.message or "does not exist" in missing.message, missing.message
