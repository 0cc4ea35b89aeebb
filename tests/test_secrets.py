"""Secrets never reach an artifact (issue 19): a run whose model args carry `--api-key` and whose
environment carries a token plants a hang (so py-spy prints every process's command line and the
log is kept as evidence); then every file the run wrote is searched for the secrets, and every
file and folder must be the user's alone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.conftest import REPO

API_KEY = "sk-plantedsecretvalue0123456789"
ENV_TOKEN = "plantedenvtoken-abcdef-0123456789"

MATRIX = f"""
name: secrets
models:
  m: {{path: org/m, args: [--api-key, {API_KEY}]}}
gpus:
  H200: {{count: 1, memory_gb: 141, ray_label: H200}}
axes: {{async_scheduling: [true]}}
workloads: {{steady: {{kind: random, concurrency: 4}}}}
profiles: {{p: {{soak: 20m, startup: 5s, workloads: [steady], retries: 0}}}}
sim: {{hang_model: hangs.yaml, time_scale: 240}}
"""

HANGS = """
seed: 3
hangs:
  - id: planted
    style: silent_stall
    when: {async_scheduling: true}
    min_running: 1
    mttf_s: 60
"""


@pytest.mark.slow
def test_planted_secrets_appear_in_no_output_file_and_files_are_private(tmp_path):
    (tmp_path / "secrets.yaml").write_text(MATRIX)
    (tmp_path / "hangs.yaml").write_text(HANGS)
    out = tmp_path / "out"
    env = {**os.environ, "SOAKMATRIX_TEST_HF_TOKEN": ENV_TOKEN}
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "run", str(tmp_path / "secrets.yaml"),
                           "--out", str(out)], capture_output=True, text=True, timeout=400, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]           # the planted hang was found
    assert API_KEY not in proc.stdout + proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"command.txt", "server.log", "junit.xml", "history.sqlite", "index.html"} <= names
    assert any(p.parent.name == "evidence" for p in files), "no evidence was captured"
    leaks = [str(p) for p in files for secret in (API_KEY, ENV_TOKEN) if secret.encode() in p.read_bytes()]
    assert not leaks, f"secrets written to: {leaks}"
    assert "[redacted]" in (next(out.rglob("command.txt"))).read_text()
    # the user's alone: no group or other bits on anything the run created
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    plan = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "plan", str(tmp_path / "secrets.yaml"),
                           "--no-validate"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert plan.returncode == 0 and API_KEY not in plan.stdout and "[redacted]" in plan.stdout
