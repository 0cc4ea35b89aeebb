"""The optional extras (matrix/extras.py): what names what, and the core's modules importing and the
CLI answering with Ray, plotly, scipy and numpy made unimportable in the interpreter under test.

Each blocked run is a fresh interpreter (`python -c`) with a meta path finder in front that refuses
the extras' modules: this test process has them imported already, and modules that register
Prometheus metrics or signal handlers at import cannot be imported twice in one process.
tests/test_core_install.py checks the same in a real environment built without them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from soakmatrix.matrix import extras
from soakmatrix.matrix.cli import NEEDS

REPO = Path(__file__).resolve().parent.parent
EXTRA_MODULES = ("ray", "plotly", "scipy", "numpy")

BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Blocker())
    sys.argv[1:2] = []
""")

# every module `soakmatrix watch` and the pytest plugin import, at start and while they work, and
# the other core commands (plan, sim-engine, doctor)
WATCH_AND_PLUGIN = (
    "soakmatrix.matrix.cli", "soakmatrix.matrix.cli.watch", "soakmatrix.matrix.cli.plan",
    "soakmatrix.matrix.cli.sim_engine", "soakmatrix.matrix.cli.doctor", "soakmatrix.jobs.doctor",
    "soakmatrix.jobs.watch.incident", "soakmatrix.jobs.watch.logsource", "soakmatrix.jobs.watch.loop",
    "soakmatrix.jobs.watch.metrics", "soakmatrix.jobs.watch.runner", "soakmatrix.jobs.watch.target",
    "soakmatrix.jobs.soak", "soakmatrix.jobs.evidence", "soakmatrix.jobs.load", "soakmatrix.jobs.engines",
    "soakmatrix.jobs.sim", "soakmatrix.jobs.sim.cli", "soakmatrix.reports.history", "soakmatrix.reports.junit",
    "soakmatrix.fixtures.pytest_plugin", "soakmatrix.fixtures.pytest_soak", "soakmatrix.fixtures.pytest_cells",
    "soakmatrix.fixtures.pytest_placement", "soakmatrix.matrix.plan", "soakmatrix.matrix.contracts.stats",
    "soakmatrix.api.matrices", "soakmatrix.api.watching", "soakmatrix.api.types", "soakmatrix.api.errors",
)


def blocked(code: str, *args: str, block: tuple[str, ...] = EXTRA_MODULES) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code), ",".join(block), *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def cli_without(block: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess:
    return blocked("from soakmatrix.matrix.cli import main\nsys.exit(main(sys.argv[1:]))", *argv, block=block)


# ---------------------------------------------------------------- the decisions, without installs

def test_a_missing_extra_names_its_modules_and_the_pip_line():
    problem = extras.missing(["ray", "reports"], present=lambda m: m == "jinja2")
    assert problem is not None and problem.extras == ("ray", "reports")
    assert problem.line("soakmatrix run") == \
        "soakmatrix run needs Ray, plotly and scipy: pip install 'soakmatrix[ray,reports]'"
    assert extras.missing(["ray", "reports", "bisect"], present=lambda m: True) is None


def test_a_module_two_extras_share_is_named_once():
    problem = extras.missing(["reports", "bisect"], present=lambda m: m not in ("scipy", "numpy"))
    assert problem is not None and problem.labels == ("scipy", "numpy")
    assert problem.line("x").endswith("pip install 'soakmatrix[reports,bisect]'")


def test_require_raises_the_error_the_cli_prints():
    with pytest.raises(extras.MissingExtra, match=r"needs Ray: pip install 'soakmatrix\[ray\]'"):
        extras.require("ray", present=lambda m: False)
    extras.require("ray", present=lambda m: True)


def test_an_unguarded_import_error_maps_to_the_commands_extra_first():
    exc = ModuleNotFoundError("No module named 'scipy.stats'", name="scipy.stats")
    assert extras.from_import_error(exc, among=["bisect"], present=lambda m: False).extras == ("bisect",)
    assert extras.from_import_error(exc, among=["reports"], present=lambda m: False).extras == ("reports",)
    assert extras.from_import_error(ModuleNotFoundError("x", name="yaml")) is None


def test_the_extras_here_are_pyprojects_extras():
    """The table the messages come from and the extras pip installs cannot drift apart."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    for extra in extras.EXTRAS.values():
        listed = {_distribution(r) for r in optional[extra.name]}
        assert listed == set(extra.modules), f"[{extra.name}] in pyproject lists {listed}"
    assert optional["all"] == [f"soakmatrix[{','.join(extras.EXTRAS)}]"]
    core = {_distribution(r) for r in project["dependencies"]}
    assert not core & {m for e in extras.EXTRAS.values() for m in e.modules}
    assert set(NEEDS) <= {"run", "smoke", "bisect", "report"} and all(
        name in extras.EXTRAS for needed in NEEDS.values() for name in needed)


def _distribution(requirement: str) -> str:
    import re

    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


# ---------------------------------------------------------------- with the extras made unimportable

def test_watch_and_the_plugin_import_without_ray_plotly_scipy_numpy():
    p = blocked("""
        import importlib
        for name in sys.argv[1:]:
            importlib.import_module(name)
        loaded = sorted({m.split(".")[0] for m in sys.modules} & {"ray", "plotly", "scipy", "numpy"})
        print("loaded:", loaded)
    """, *WATCH_AND_PLUGIN)
    assert p.returncode == 0, p.stderr
    assert "loaded: []" in p.stdout


def test_the_blocker_does_block():
    p = blocked("import scipy")
    assert p.returncode != 0 and "No module named 'scipy'" in p.stderr


def test_mttf_without_a_hang_needs_no_scipy():
    p = blocked("""
        from soakmatrix.matrix.contracts.stats import mttf_estimate
        print(round(mttf_estimate(0, 3000.0).low_s))
    """)
    assert p.returncode == 0 and p.stdout.strip() == "1001", p.stderr


@pytest.mark.parametrize("argv, line", [
    (("run", "matrix/examples/demo.yaml", "--out", "{tmp}/out"),
     "soakmatrix run needs Ray, plotly and scipy: pip install 'soakmatrix[ray,reports]'"),
    (("smoke", "matrix/examples/demo.yaml", "--out", "{tmp}/out"),
     "soakmatrix smoke needs Ray, plotly and scipy: pip install 'soakmatrix[ray,reports]'"),
    (("bisect", "matrix/examples/demo.yaml", "--cell", "1", "--virtual"),
     "soakmatrix bisect needs scipy and numpy: pip install 'soakmatrix[bisect]'"),
    (("report", "{tmp}/history.sqlite"),
     "soakmatrix report needs plotly and scipy: pip install 'soakmatrix[reports]'"),
])
def test_a_command_without_its_extra_says_what_to_install_and_exits_2(tmp_path, argv, line):
    if argv[0] == "report":   # a store that holds a run: the option's own checks pass, the extra is missing
        from soakmatrix.reports.history import HistoryStore

        with HistoryStore(tmp_path / "history.sqlite") as store:
            store.start_run(matrix="m", profile="p")
    p = cli_without(EXTRA_MODULES, *(a.format(tmp=tmp_path) for a in argv))
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == line
    assert not (tmp_path / "out").exists()


def test_run_with_every_extra_but_ray_names_only_ray(tmp_path):
    p = cli_without(("ray",), "run", "matrix/examples/demo.yaml", "--out", str(tmp_path / "out"))
    assert (p.returncode, p.stderr.strip()) == (2, "soakmatrix run needs Ray: pip install 'soakmatrix[ray]'")


def test_help_needs_no_extra_and_the_core_commands_run():
    assert "--ray-address" in cli_without(EXTRA_MODULES, "run", "--help").stdout
    p = cli_without(EXTRA_MODULES, "plan", "matrix/examples/demo.yaml")
    assert p.returncode == 0 and "cells" in p.stdout, p.stderr


def _first_demo_cell() -> str:
    """The demo's first cell id, planned in this process (`soakmatrix plan` would also import vLLM's
    argument parser to check the flags: 10 CPU-seconds that these tests do not need)."""
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    return plan(load_matrix(REPO / "matrix" / "examples" / "demo.yaml")).cells[0].id


def test_flag_bisection_on_ray_without_it_says_so(tmp_path):
    """`bisect` needs Ray only for real probes: the cluster connection checks, before any probe."""
    cell = _first_demo_cell()
    p = cli_without(("ray",), "bisect", "matrix/examples/demo.yaml", "--cell", cell, "--out", str(tmp_path / "b"))
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().endswith("soakmatrix bisect needs Ray: pip install 'soakmatrix[ray]'")
    assert "Traceback" not in p.stderr


def test_virtual_bisection_needs_only_the_bisect_extra():
    p = cli_without(("ray", "plotly", "jinja2"), "bisect", "matrix/examples/demo.yaml", "--cell", _first_demo_cell(),
                    "--virtual", "--max-probes", "5", "--quiet")
    assert p.returncode == 0 and "nothing to bisect" in p.stdout, p.stdout + p.stderr


def test_the_plugins_ray_address_without_ray_is_a_usage_error(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    p = blocked("import pytest\nsys.exit(pytest.main(sys.argv[1:]))", "-p", "no:cacheprovider",
                "--ray-address", "127.0.0.1:1", str(tmp_path / "test_nothing.py"))
    assert p.returncode == 4, p.stdout + p.stderr
    assert "--ray-address needs Ray: pip install 'soakmatrix[ray]'" in p.stderr
