"""`run_cell` end to end: a small fake server for the fast paths, the simulated engine for every hang
style, slow prefills without a false alarm, evidence present and nothing left behind."""

import json
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from tests.fake_openai import foreign_models_server

from soakmatrix.jobs import server_process, teardown
from soakmatrix.jobs.hang_confirmation import ConfirmationWindow
from soakmatrix.jobs.engines.protocol import LaunchCommand
from soakmatrix.jobs.soak import SoakOptions, run_cell
from soakmatrix.jobs.soak_spec import SoakSpec, effective_time_scale
from soakmatrix.jobs.watchdog import WatchdogConfig
from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.workloads import Workload, params_of

# every test here starts a server
pytestmark = [pytest.mark.slow, pytest.mark.waits]   # simulated servers' clocks: a tenth of a core

FAKE = str(Path(__file__).resolve().parent / "fake_openai.py")
QUICK = SoakOptions(watchdog=WatchdogConfig(tick_s=0.25, scrape_every_s=0.5, health_every_s=1.0),
                    detector_options={"progress": {"floor_s": 3}, "stream": {"floor_s": 3}},
                    drain_s=10, teardown_grace_s=3)


class FakeEngine:
    name = "fake"

    def __init__(self, *extra):
        self.extra = list(extra)

    def command(self, spec, host, port):
        return LaunchCommand([sys.executable, FAKE, "--port", str(port),
                              "--hang-record", f"{spec.artifacts_dir}/sim-hangs.jsonl", *self.extra])

    def version(self):
        return "fake 0"


def workload(kind="random", **params):
    defaults = {k: d for k, (_, d) in params_of(kind).items()}
    return Workload(f"{kind}-w", kind, {**defaults, "concurrency": 4, "input_len": [5, 30],
                                        "output_len": [20, 80], **params})


def spec_for(tmp_path, soak_s=8.0, backend="fake", **kw):
    base = dict(cell_id="cell1", cell_name="tiny|cpu|x=1|w", model="tiny", model_path="tiny", gpu_type="H200",
                gpu_count=1, workload=workload(), flags={"tp": 1}, serve_args=(), soak_s=soak_s,
                startup_timeout_s=60, backend=backend, artifacts_dir=str(tmp_path / "cells" / "cell1"))
    base.update(kw)
    return SoakSpec(**base)


@pytest.fixture
def server_temp_dirs(monkeypatch):
    """The private temp dirs the launcher makes for the servers of a test (to check they are gone)."""
    made: list[Path] = []
    real = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(Path(real(*args, **kwargs)))
        return str(made[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return made


def no_process_left(result, server_alive_until_teardown=True):
    pids = result.teardown["pids"]
    assert pids or not server_alive_until_teardown
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                            for p in pids)
    assert result.teardown["clean"]


def test_a_silent_hang_is_found_with_evidence_and_a_result_file(tmp_path):
    events = []
    r = run_cell(spec_for(tmp_path, soak_s=60), engine=FakeEngine("--hang-after-s", "3", "--child"),
                 on_event=lambda kind, data: events.append(kind), options=QUICK)
    assert r.outcome == Outcome.HANG and r.signature == "silent_stall" and r.detector in ("progress", "stream")
    assert r.message.startswith("tokens stopped at ") and f"detector {r.detector} fired after" in r.message
    assert r.detected_after_s >= 3 and r.time_to_hang_s >= 2 and abs(r.exposure_s - r.time_to_hang_s) < 0.1
    assert r.tokens > 0 and r.requests > 0 and r.node and r.engine == "fake" and r.vllm_version == "fake 0"
    assert r.fingerprint and r.stuck_frames and r.log_tail and not r.stalls
    for name in ("py_spy", "metrics", "server_log", "sim_hangs", "result"):
        assert Path(r.artifacts[name]).exists(), name
    assert 0 < r.latency_from_true_start_s < 20
    assert r.health["status_counts"].get("200")        # recorded, not trusted
    saved = json.loads(Path(r.artifacts["result"]).read_text())
    assert saved["outcome"] == "hang" and saved["signature"] == "silent_stall"
    assert events[:3] == ["launching", "ready", "load"] and events[-1] == "done" and "verdict" in events
    no_process_left(r)


FROZEN_FOR_6_S = ("--freeze-after-s", "2", "--freeze-for-s", "6")


def test_a_frozen_server_that_recovers_is_a_stall_kept_with_its_stacks_not_a_hang(tmp_path):
    # a starved host: the whole server answers nothing for 6 s, longer than the 3 s stall threshold
    options = replace(QUICK, confirmation=ConfirmationWindow(after_verdict_s=6))
    r = run_cell(spec_for(tmp_path, soak_s=14), engine=FakeEngine(*FROZEN_FOR_6_S), options=options)
    assert r.outcome == Outcome.PASSED, r.message
    [stall] = r.stalls
    assert stall["detector"] in ("progress", "stream") and stall["silent_s"] >= 3
    assert stall["resumed_at"] > stall["verdict_at"]
    assert "1 stall that recovered" in r.message
    assert "Thread" in (Path(stall["evidence"]) / "py-spy.txt").read_text()   # the stall's stacks are kept
    assert not (Path(spec_for(tmp_path).artifacts_dir) / "evidence").exists()
    assert r.signature is None and r.load["completed"] > 0
    no_process_left(r)


def test_without_the_confirmation_every_verdict_stands(tmp_path):
    r = run_cell(spec_for(tmp_path, soak_s=14), engine=FakeEngine(*FROZEN_FOR_6_S),
                 options=replace(QUICK, confirmation=None))
    assert r.outcome == Outcome.HANG and not r.stalls, r.message
    no_process_left(r)


def test_exposure_and_time_to_hang_count_from_the_first_request_not_from_a_slow_model_discovery(tmp_path):
    # discovery takes 3 s, then the engine hangs 3 s into its load: the 3 s before the first
    # request are not time the engine survived (at the sim's time scale they would read as minutes)
    r = run_cell(spec_for(tmp_path, soak_s=60), options=QUICK,
                 engine=FakeEngine("--hang-after-s", "3", "--models-delay-s", "3"))
    assert r.outcome == Outcome.HANG, r.message
    assert 2.9 <= r.load_start_delay_s < 6
    assert 2 <= r.time_to_hang_s < 5 and abs(r.exposure_s - r.time_to_hang_s) < 0.1, r.to_dict()
    no_process_left(r)


def test_a_healthy_cell_passes(tmp_path, server_temp_dirs):
    r = run_cell(spec_for(tmp_path, soak_s=4), engine=FakeEngine(), options=QUICK)
    assert r.outcome == Outcome.PASSED and r.requests > 0 and r.signature is None
    assert not r.true_hang
    assert 3.5 < r.exposure_s < 20
    no_process_left(r)
    assert len(server_temp_dirs) == 1 and not server_temp_dirs[0].exists()


def test_a_rejected_flag_is_a_config_error(tmp_path, server_temp_dirs):
    r = run_cell(spec_for(tmp_path), engine=FakeEngine("--no-such-flag"), options=QUICK)
    assert r.outcome == Outcome.CONFIG_ERROR and "no-such-flag" in r.message and r.log_tail
    assert json.loads((tmp_path / "cells" / "cell1" / "result.json").read_text())["outcome"] == "config_error"
    assert len(server_temp_dirs) == 1 and not server_temp_dirs[0].exists()


def test_stop_cancels_as_infra_error_and_tears_down(tmp_path):
    stop = threading.Event()
    r = run_cell(spec_for(tmp_path, soak_s=600), engine=FakeEngine("--child"), stop=stop,
                 on_event=lambda kind, _: stop.set() if kind == "load" else None, options=QUICK)
    assert r.outcome == Outcome.INFRA_ERROR and r.message == "cancelled"
    no_process_left(r)


def test_a_leak_of_the_previous_cell_is_an_infra_error_for_the_next(tmp_path):
    import subprocess
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        report = teardown.TeardownReport(pids=[leftover.pid], survivors=[leftover.pid])
        teardown.record_leak(tmp_path / "cells", "cell0", report, port=None)
        r = run_cell(spec_for(tmp_path), engine=FakeEngine(), options=QUICK)
        assert r.outcome == Outcome.INFRA_ERROR and "cell cell0 left" in r.message
    finally:
        leftover.kill()
        leftover.wait()
    assert run_cell(spec_for(tmp_path, soak_s=2), engine=FakeEngine(), options=QUICK).outcome == Outcome.PASSED


def test_a_retry_keeps_the_previous_attempt(tmp_path):
    run_cell(spec_for(tmp_path), engine=FakeEngine("--no-such-flag"), options=QUICK)
    run_cell(spec_for(tmp_path, attempt=2), engine=FakeEngine("--no-such-flag"), options=QUICK)
    folder = tmp_path / "cells" / "cell1"
    assert (folder / "previous-1" / "result.json").exists() and (folder / "result.json").exists()


# ------------------------------------------------------------------ the simulated engine

HANG_MODEL = """seed: 3
hangs:
  - id: planted
    style: {style}
    when: {{}}
    min_running: 1
    mttf_s: 4
"""


@pytest.mark.slow
@pytest.mark.parametrize("style", ["silent_stall", "event_sync_stall", "shm_broadcast", "crash"])
def test_every_hang_style_of_the_simulated_engine(tmp_path, style):
    model = tmp_path / "hangs.yaml"
    model.write_text(HANG_MODEL.format(style=style))
    spec = spec_for(tmp_path, soak_s=90, backend="sim", hang_model=str(model), workload=workload(concurrency=6))
    r = run_cell(spec)
    assert r.outcome == (Outcome.CRASH if style == "crash" else Outcome.HANG), r.message
    assert r.signature == STYLE_SIGNATURE[style], r.message
    truth = r.true_hang
    assert truth["signature"] == r.signature
    assert 0 <= r.latency_from_true_start_s < 20
    assert Path(r.artifacts["server_log"]).exists() and r.log_tail
    if style != "crash":
        stacks = Path(r.artifacts["py_spy"]).read_text()
        assert "VLLM::EngineCore" in stacks or "EngineCore" in stacks
        if style == "event_sync_stall":
            assert any("_to_list" in f for f in r.stuck_frames)
    no_process_left(r, server_alive_until_teardown=(style != "crash"))


@pytest.mark.slow
def test_slow_prefills_are_not_a_hang(tmp_path):
    # no chunking and prompts up to 12k tokens: single steps of several seconds, no alarm
    spec = spec_for(tmp_path, soak_s=45, backend="sim", seed=1,
                    serve_args=("--no-enable-chunked-prefill", "--max-model-len", "16384"),
                    workload=workload(input_len=[2000, 12000], output_len=[8, 48]))
    r = run_cell(spec)
    assert r.outcome == Outcome.PASSED, r.message
    assert r.load["gap_max_s"] > 3        # the slow steps really happened
    no_process_left(r)


@pytest.mark.slow
@pytest.mark.parametrize("style,detector,signature", [
    ("shm_broadcast", "logs", "shm_broadcast_timeout"),   # warnings every 2 s at --time-scale 30
    ("crash", "exit", "crash"),                            # the server goes away
])
def test_log_and_exit_detectors_alone_catch_the_simulated_engine(tmp_path, style, detector, signature):
    model = tmp_path / "hangs.yaml"
    model.write_text(HANG_MODEL.format(style=style).replace("mttf_s: 4", "mttf_s: 120"))
    spec = spec_for(tmp_path, soak_s=60 * 30, backend="sim", hang_model=str(model), time_scale=30.0)
    r = run_cell(spec, options=SoakOptions(detector_names=[detector], drain_s=5))
    assert r.detector == detector and r.signature == signature, r.message
    assert r.time_scale == 30.0 and r.exposure_s >= 30 * r.wall_exposure_s * 0.99
    no_process_left(r, server_alive_until_teardown=(style != "crash"))


@pytest.mark.slow
@pytest.mark.parametrize("kind,params", [
    ("chat", {"sessions": 4, "turns": 3, "shared_prefix_len": 200}),
    ("ramp", {"concurrency": 2, "peak": 12, "ramp_s": 8, "spike_every_s": 6, "spike_len_s": 2}),
    ("trickle", {"idle_s": 4, "max_burst": 2, "burst_every_s": 1}),
])
def test_every_workload_kind_runs_clean_against_the_simulated_engine(tmp_path, kind, params):
    spec = spec_for(tmp_path, soak_s=16, backend="sim", workload=workload(kind, **params))
    r = run_cell(spec, options=SoakOptions(drain_s=20))
    assert r.outcome == Outcome.PASSED, r.message
    assert r.requests > 3 and r.load["failed"] == 0
    no_process_left(r)


@pytest.mark.slow
def test_seed_004_shape_a_hang_while_idle_is_caught_when_the_trickle_resumes(tmp_path):
    # the engine hangs during an idle gap; the metrics still say 0 running, only the client sees it
    model = tmp_path / "hangs.yaml"
    model.write_text(HANG_MODEL.format(style="silent_stall").replace("min_running: 1", "min_running: 0")
                     .replace("mttf_s: 4", "mttf_s: 2"))
    spec = spec_for(tmp_path, soak_s=60, backend="sim", hang_model=str(model),
                    workload=workload("trickle", idle_s=5, max_burst=2, burst_every_s=1))
    r = run_cell(spec)
    assert r.outcome == Outcome.HANG and r.signature == "silent_stall", r.message
    assert r.detector in ("stream", "progress")
    no_process_left(r)


def test_a_port_taken_at_start_up_is_retried_on_a_new_port(tmp_path, server_temp_dirs):
    import socket

    class RacedEngine(FakeEngine):
        """The first launch meets a port someone else grabbed after we picked it."""
        def __init__(self, taken):
            super().__init__()
            self.taken, self.calls = taken, 0

        def command(self, spec, host, port):
            self.calls += 1
            return super().command(spec, host, self.taken if self.calls == 1 else port)

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        engine = RacedEngine(holder.getsockname()[1])
        r = run_cell(spec_for(tmp_path, soak_s=3), engine=engine, options=QUICK)
    assert engine.calls == 2 and r.outcome == Outcome.PASSED, r.message
    assert "address already in use" in Path(r.artifacts["server_log"]).read_text().lower()
    assert len(server_temp_dirs) == 2 and not any(d.exists() for d in server_temp_dirs)   # both launches'


def test_a_port_taken_by_a_server_that_answers_is_retried_not_soaked(tmp_path, server_temp_dirs, monkeypatch):
    # the demo's clean-clone run, 2026-12-03: between the pick of a free port and the engine's bind,
    # another server took the port and answered /v1/models there; the readiness check took it for
    # ours, and ours, dead of "address already in use", was reported as a crash finding
    holder = foreign_models_server()
    picks = []
    real_free_port = server_process.free_port

    def racing_free_port(host="127.0.0.1"):
        picks.append(holder.server_address[1] if not picks else real_free_port(host))
        return picks[-1]

    monkeypatch.setattr(server_process, "free_port", racing_free_port)
    try:
        # the engine takes a second to bind, as vLLM takes a minute: the other server answers first
        r = run_cell(spec_for(tmp_path, soak_s=3), engine=FakeEngine("--startup-s", "1"), options=QUICK)
    finally:
        holder.shutdown()
        holder.server_close()
    assert len(picks) == 2 and r.outcome == Outcome.PASSED, r.message
    assert not any(d.exists() for d in server_temp_dirs)
    no_process_left(r)


def test_a_dead_engine_behind_a_living_api_server_is_a_crash_not_a_pass(tmp_path):
    r = run_cell(spec_for(tmp_path, soak_s=30), engine=FakeEngine("--hang-after-s", "2", "--hang-style", "error"),
                 options=QUICK)
    assert r.outcome == Outcome.CRASH and r.detector == "errors" and r.signature == "crash", r.message
    assert "requests in a row failed" in r.message
    no_process_left(r)


def test_the_command_file_reproduces_the_launch_with_its_environment(tmp_path):
    r = run_cell(spec_for(tmp_path, soak_s=2, env={"VLLM_LOG_STATS_INTERVAL": "1"}), engine=FakeEngine(),
                 options=QUICK)
    line = Path(r.artifacts["command"]).read_text()
    assert line.startswith("VLLM_LOG_STATS_INTERVAL=1 ") and "fake_openai.py --port " in line


def test_only_the_simulated_engine_runs_faster_than_the_wall_clock():
    assert effective_time_scale("sim", 30.0) == 30.0
    assert effective_time_scale("vllm", 30.0) == 1.0
    assert effective_time_scale("sim", 0.0) == 1.0   # never valid in a matrix or a marker; as if unset


def test_the_result_file_carries_the_cells_build_and_is_private(tmp_path, monkeypatch):
    monkeypatch.setattr(teardown, "preflight", lambda state_dir: "a server of an earlier cell is still running")
    spec = spec_for(tmp_path, build="nightly-1125", build_ordinal=3)
    result = run_cell(spec, engine=FakeEngine(), options=QUICK)
    assert result.outcome is Outcome.INFRA_ERROR
    saved = json.loads((Path(spec.artifacts_dir) / "result.json").read_text())
    assert (saved["build"], saved["build_ordinal"]) == ("nightly-1125", 3)
    assert Path(spec.artifacts_dir).stat().st_mode & 0o077 == 0
