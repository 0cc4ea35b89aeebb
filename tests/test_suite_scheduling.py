"""How `make test TEST_WORKERS=2` hands the suite to two xdist workers (tests/conftest.py): every
module with a real-engine test is in the one unit of work that runs alone on a worker, the modules
that start Ray Client servers in another, and the other modules are units of their own."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import RAY_CLIENT_GROUP, REAL_ENGINE_GROUP, REPO, real_engine_modules, work_unit


def test_the_real_engine_unit_is_every_module_that_collects_a_vllm_test():
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "vllm", "-p", "no:xdist",
                                "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    modules = {line.split("::", 1)[0].rsplit("/", 1)[-1] for line in collected.stdout.splitlines() if "::" in line}
    assert modules, collected.stdout[-2000:]
    assert modules == set(real_engine_modules())


def test_units_are_modules_and_the_real_engine_modules_share_one():
    assert work_unit("tests/test_vllm_bisect.py::test_x") == work_unit("tests/test_vllm_e2e.py::test_y[a]") \
        == REAL_ENGINE_GROUP
    assert work_unit("tests/test_bisect.py::test_a") == work_unit("tests/test_bisect.py::TestC::test_b[1]") \
        == "tests/test_bisect.py"
    assert work_unit("tests/test_bisect.py::test_a") != work_unit("tests/test_plan.py::test_a")


def test_the_modules_that_start_ray_client_servers_share_a_unit():
    assert work_unit("tests/test_run_cli.py::test_a") == work_unit("tests/test_bisect_cli.py::test_b") \
        == work_unit("tests/test_cluster.py::test_c") == RAY_CLIENT_GROUP
