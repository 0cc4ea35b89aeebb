"""How `make test` hands the suite to xdist workers (tests/xdist_suite.py): the real engine's tests in
two chains by module, each at the head of its own worker's share, so that work stealing leaves two
engines starting side by side, never more; the tests that mostly wait, and those that start a Ray
Client server, each at the head of a share of their own; a test whose worker dies under it runs once
more on a new worker."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from tests.xdist_suite import engine_starts, lanes, runs_the_real_engine, share_sizes, suite_order, two_chains

pytestmark = pytest.mark.slow   # each test runs a small suite of its own on two xdist workers


class Item:
    def __init__(self, nodeid: str, starts: int | None = None, marks: tuple[str, ...] = ()):
        self.nodeid, self.starts, self.marks = nodeid, starts, marks

    def get_closest_marker(self, name: str):
        if name in self.marks:
            return SimpleNamespace(name=name, kwargs={})
        if name != "vllm" or self.starts is None:
            return None
        return SimpleNamespace(name=name, kwargs={"starts": self.starts} if self.starts else {})

    def __repr__(self) -> str:
        return self.nodeid


def ids(items) -> list[str]:
    return [item.nodeid for item in items]


def test_the_real_engine_tests_are_the_ones_marked_vllm_and_their_starts_are_declared():
    assert runs_the_real_engine(Item("t::x", starts=0)) and not runs_the_real_engine(Item("t::y"))
    assert engine_starts(Item("t::x", starts=4)) == 4
    assert engine_starts(Item("t::x", starts=0)) == 0 and engine_starts(Item("t::y")) == 0


def test_the_real_engine_modules_split_into_two_chains_of_about_equal_starts_a_module_never_split():
    hangs = [Item(f"tests/test_h.py::t{i}", starts=4) for i in range(3)]
    bisect, builds = Item("tests/test_b.py::t", starts=3), Item("tests/test_u.py::t", starts=2)
    plugin, imports = Item("tests/test_p.py::t", starts=1), Item("tests/test_i.py::t", starts=0)
    first, second = two_chains([imports, *hangs, bisect, plugin, builds])
    assert ids(first) == ids([*hangs, plugin, imports]) and ids(second) == ids([bisect, builds])


def test_each_chain_heads_its_own_workers_share_and_the_rest_keeps_its_order():
    rest = [Item(f"tests/test_s.py::t{i}") for i in range(20)]
    a, b = Item("tests/test_a.py::t", starts=3), Item("tests/test_b.py::t", starts=2)
    items = [rest[0], a, *rest[1:10], b, *rest[10:]]
    suite_order(items, workers=3)
    share = len(items) // 3        # worksteal hands the first worker the first third
    assert items[0] is a and items[share] is b
    assert ids([item for item in items if item not in (a, b)]) == ids(rest)
    single = [rest[0], a, *rest[1:10], b, *rest[10:]]
    suite_order(single, workers=1)          # one worker: both chains first
    assert ids(single[:2]) == ids([a, b]) and ids(single[2:]) == ids(rest)


def test_share_sizes_are_worksteals_first_shares():
    assert share_sizes(10, 3) == [3, 3, 4] and share_sizes(1201, 4) == [300, 300, 300, 301]
    assert sum(share_sizes(7, 5)) == 7


def test_waiting_and_ray_client_tests_head_shares_of_their_own_on_four_workers():
    rest = [Item(f"tests/test_s.py::t{i}") for i in range(30)]
    a, b = Item("tests/test_a.py::t", starts=3), Item("tests/test_b.py::t", starts=2)
    waits = [Item(f"tests/test_w.py::t{i}", marks=("waits",)) for i in range(3)]
    client = [Item("tests/test_c.py::t", marks=("ray_client",)),
              Item("tests/test_wc.py::t", marks=("waits", "ray_client"))]     # a Ray Client test is in its lane
    items = [rest[0], waits[0], a, *rest[1:10], client[0], b, waits[1], *rest[10:20], client[1], waits[2], *rest[20:]]
    assert [ids(lane) for lane in lanes(items)] == [ids([a]), ids([b]), ids(waits), ids(client)]
    suite_order(items, workers=4)
    starts = [0, 9, 18, 27]                                              # share_sizes(37, 4)
    assert share_sizes(len(items), 4) == [9, 9, 9, 10]
    assert [items[i] for i in starts] == [a, b, waits[0], client[0]]
    assert ids(items[19:21]) == ids(waits[1:]) and items[28] is client[1]
    lane_items = {id(x) for x in (a, b, *waits, *client)}
    assert ids([x for x in items if id(x) not in lane_items]) == ids(rest)   # the rest keeps its order
    three = [rest[0], waits[0], a, *rest[1:10], client[0], b, *rest[10:]]
    suite_order(three, workers=3)                                      # no fourth worker: its lane joins the third's
    assert [three[i] for i in (0, len(three) // 3)] == [a, b]
    third = share_sizes(len(three), 3)
    assert ids(three[sum(third[:2]):sum(third[:2]) + 2]) == ids([waits[0], client[0]])


DIES = '''
import os
from pathlib import Path


def test_before():
    pass


def test_dies(tmp_path):
    tries = Path(os.environ["TRIES_FILE"])
    tries.write_text(tries.read_text() + "x" if tries.exists() else "x")
    if os.environ["DIE"] == "always" or len(tries.read_text()) == 1:
        os._exit(9)   # the worker process dies under the test, as a killed or crashed worker does


def test_after():
    pass
'''

OTHER = '''
def test_one():
    pass


def test_two():
    pass
'''


# a small suite's conftest with this suite's xdist hooks
CONFTEST = (f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
            "from tests.xdist_suite import (pytest_handlecrashitem, pytest_report_teststatus,  # noqa: F401\n"
            "                               pytest_terminal_summary)\n")


def run_two_workers(tmp_path, die: str) -> tuple[subprocess.CompletedProcess, int]:
    """A suite of five tests on two xdist workers with this suite's hooks; one test kills its worker
    the first time (`die="once"`) or every time (`"always"`). The output and the test's tries."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_dies.py").write_text(DIES)
    (tmp_path / "test_other.py").write_text(OTHER)
    tries = tmp_path / "tries"
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider", "--rootdir",
                          str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "TRIES_FILE": str(tries), "DIE": die})
    return run, len(tries.read_text()) if tries.exists() else 0


def test_a_test_whose_worker_died_runs_again_on_a_new_worker_and_its_pass_counts(tmp_path):
    run, tries = run_two_workers(tmp_path, "once")
    out = run.stdout
    assert run.returncode == 0, out[-3000:]
    assert tries == 2
    assert "5 passed, 1 rerun" in out, out[-3000:]
    assert "replacing crashed worker" in out
    # the crash is not hidden: the summary says which test's worker died, and that it ran again
    summary = out[out.index("tests run again after their worker died"):]
    assert "test_dies.py::test_dies: worker 'gw" in summary and "crashed while running" in summary
    assert "run again on a new worker" in summary


def test_a_test_that_kills_its_worker_twice_fails(tmp_path):
    run, tries = run_two_workers(tmp_path, "always")
    out = run.stdout
    assert run.returncode == 1, out[-3000:]
    assert tries == 2                     # run once more, not for ever
    assert "1 failed, 4 passed, 1 rerun" in out, out[-3000:]
    assert "FAILED test_dies.py::test_dies" in out


def test_a_worker_that_dies_after_finishing_modules_leaves_no_test_unrun(tmp_path):
    # The dead worker had finished many tests before it died: only its unfinished ones are handed out
    # again (xdist's LoadScope hands out finished modules too, and then waits for ever)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for module in range(30):
        tests = [f"def test_{t}():\n    time.sleep(0.05)\n" for t in range(4)]
        if module == 12:
            tests[1] = ("def test_1():\n    tries = Path(os.environ['TRIES_FILE'])\n"
                        "    tries.write_text(tries.read_text() + 'x' if tries.exists() else 'x')\n"
                        "    if len(tries.read_text()) == 1:\n        os._exit(9)\n")
        (tmp_path / f"test_m{module:02d}.py").write_text("import os\nimport time\nfrom pathlib import Path\n\n\n"
                                                        + "\n\n".join(tests))
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "TRIES_FILE": str(tmp_path / "tries")})
    assert run.returncode == 0, run.stdout[-3000:]
    assert "120 passed, 1 rerun" in run.stdout, run.stdout[-3000:]
