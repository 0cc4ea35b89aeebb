"""`pip install soakmatrix` without extras, in a fresh virtual environment: no Ray, plotly, scipy or
numpy arrive, and `watch`, `sim-engine` and the pytest plugin work there, while `run` says which
extra to install. pip resolves the core from pyproject.toml as a user's pip would, so a dependency
the core needs but does not list fails here. (tests/test_extras.py checks the same imports in this
environment with the extras blocked, in seconds.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from soakmatrix.fixtures.sim_testing import SimProcess, load

REPO = Path(__file__).resolve().parent.parent
EXTRA_DISTRIBUTIONS = {"ray", "plotly", "scipy", "numpy", "jinja2"}
HANG_MODEL = ("seed: 5\nhangs:\n  - id: planted\n    style: shm_broadcast\n    when: {max_num_seqs: 253}\n"
              "    min_running: 1\n    mttf_s: 3\n")
SOAK_TEST = '''\
import pytest

@pytest.mark.soak(flags={"mtp": 0}, duration="1m", time_scale=60)
def test_a_healthy_soak():
    """no body: the soak is the test"""
'''


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _in(core: Path, *argv: str, cwd: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    # run outside the checkout: its `soakmatrix/` folder must not stand in for the installed package
    return subprocess.run([str(core / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env={**_clean_env(), **kw.pop("env", {})}, **kw)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_core_install_watches_and_soaks_and_run_names_its_extras(tmp_path, monkeypatch):
    """One test, one venv: the install is most of its time (about 1.5 min), and xdist could hand
    separate tests of one module-scoped venv to two workers, each building its own."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
                          str(REPO), "pytest"], capture_output=True, text=True, timeout=420, env=_clean_env())
    assert pip.returncode == 0, pip.stdout + pip.stderr
    core = venv / "bin"

    # nothing of the extras came along, not even through another package's requirements
    listed = _in(core, "python", "-m", "pip", "list", "--format=freeze", cwd=tmp_path)
    installed = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "soakmatrix" in installed and not installed & EXTRA_DISTRIBUTIONS, sorted(installed)
    version = _in(core, "soakmatrix", "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("soakmatrix "), version.stderr

    # a command that needs extras names them, before it writes anything
    run = _in(core, "soakmatrix", "run", str(REPO / "matrix" / "examples" / "demo.yaml"), "--out",
              str(tmp_path / "o"), cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == \
        "soakmatrix run needs Ray, plotly, jinja2 and scipy: pip install 'soakmatrix[ray,reports]'"
    assert not (tmp_path / "o").exists()

    # watch catches a planted hang of the core's own simulated engine and keeps the evidence
    assert "--max-incidents" in _in(core, "soakmatrix", "watch", "--help", cwd=tmp_path).stdout
    (tmp_path / "hangs.yaml").write_text(HANG_MODEL)
    monkeypatch.chdir(tmp_path)   # the engine starts here, outside the checkout
    sim = SimProcess(["--max-num-seqs", "253", "--hang-model", str(tmp_path / "hangs.yaml")], tmp_path / "sim.log",
                     env=_clean_env())
    sim.argv[0] = str(core / "python")   # the core's own `python -m soakmatrix.jobs.sim`
    with sim:
        threading.Thread(target=load, args=(sim.url, 4, 60), kwargs={"request_timeout": 70}, daemon=True).start()
        watch = _in(core, "soakmatrix", "watch", sim.url, "--log", str(tmp_path / "sim.log"), "--out", "incidents",
                    "--store", "history.db", "--max-incidents", "1", "--duration", "60s", cwd=tmp_path, timeout=150)
    assert watch.returncode == 1, watch.stdout + watch.stderr
    assert "HANG detected" in watch.stdout
    (folder,) = (tmp_path / "incidents").iterdir()
    assert (folder / "py-spy.txt").exists() and (folder / "metrics.txt").exists()

    # the pytest plugin: loaded from its entry point, or named where autoloading is off
    helped = _in(core, "python", "-m", "pytest", "--help", cwd=tmp_path)
    assert "--soak-engine" in helped.stdout, helped.stderr
    explicit = _in(core, "python", "-m", "pytest", "-p", "soakmatrix.fixtures.pytest_plugin", "--help", cwd=tmp_path,
                   env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "--soak-engine" in explicit.stdout, explicit.stderr
    (tmp_path / "test_soak.py").write_text(SOAK_TEST)
    soak = _in(core, "python", "-m", "pytest", "-p", "no:cacheprovider", "--soak-drain", "5", "-q", "test_soak.py",
               cwd=tmp_path, timeout=300)
    assert soak.returncode == 0 and "1 passed" in soak.stdout, soak.stdout + soak.stderr
