"""The watchdog against a live server: one verdict naming the detector and when; /health never trusted."""

import time

import pytest
from tests.fake_openai import serve_in_thread, start_fake

from soakmatrix.jobs.detect.protocol import build_detectors
from soakmatrix.jobs.load import LoadDriver
from soakmatrix.jobs.watchdog import LogFollower, Watchdog, WatchdogConfig, http_get
from soakmatrix.matrix.contracts.workloads import Workload, params_of

pytestmark = pytest.mark.waits   # live servers' clocks: a tenth of a core

FAST = WatchdogConfig(tick_s=0.2, scrape_every_s=0.5, health_every_s=0.5)


def workload(**params):
    defaults = {k: d for k, (_, d) in params_of("random").items()}
    return Workload("w", "random", {**defaults, "concurrency": 4, "input_len": [5, 10], "output_len": [20, 40],
                                    **params})


class InThread:
    """A RunningServer stand-in for an in-process server (no process, no log)."""
    def __init__(self, port):
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = None

    def poll(self):
        return None


def test_log_follower_returns_only_new_complete_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("a\nb\npart")
    f = LogFollower(log)
    assert f.new_lines() == ["a", "b"]
    with open(log, "a") as fh:
        fh.write("ial\nc\n")
    assert f.new_lines() == ["partial", "c"] and f.new_lines() == []


@pytest.mark.slow
def test_silent_hang_gets_one_verdict_and_health_stays_recorded_as_200():
    engine, stop = serve_in_thread(step_s=0.01, hang_after_s=3)
    port = engine.port
    load = LoadDriver(f"http://127.0.0.1:{port}", workload(), seed=0, duration_s=60).start()
    dog = Watchdog(InThread(port), load, build_detectors(options={"progress": {"floor_s": 3},
                                                                  "stream": {"floor_s": 3}}), FAST)
    try:
        t0 = time.monotonic()
        verdict = dog.watch(until=time.monotonic() + 60)
        elapsed = time.monotonic() - t0
    finally:
        load.stop()
        dog.close()
        stop.set()
    assert verdict is not None and verdict.kind == "hang" and verdict.detector in ("progress", "stream")
    assert verdict.since is not None and verdict.at - verdict.since >= 3
    assert elapsed < 30
    assert dog.health and all(status == 200 for _, status in dog.health)   # a stuck engine looks healthy


@pytest.mark.slow
def test_a_healthy_run_with_slow_scrapes_has_no_verdict():
    engine, stop = serve_in_thread(step_s=0.01)
    port = engine.port

    def slow_get(url, timeout_s):
        if url.endswith("/metrics"):
            time.sleep(min(timeout_s, 2.5))     # the CPU build's API server under load
        return http_get(url, timeout_s)

    load = LoadDriver(f"http://127.0.0.1:{port}", workload(), seed=0, duration_s=12).start()
    dog = Watchdog(InThread(port), load, build_detectors(options={"progress": {"floor_s": 3},
                                                                  "stream": {"floor_s": 3}}),
                   WatchdogConfig(tick_s=0.2, scrape_every_s=0.5, scrape_timeout_s=1.0), get=slow_get)
    try:
        verdict = dog.watch(until=time.monotonic() + 12, done=lambda: load.finished)
    finally:
        load.stop()
        dog.close()
        stop.set()
    assert verdict is None
    assert load.stats.completed > 10


@pytest.mark.slow
def test_process_exit_is_a_crash_verdict_from_the_exit_or_log_detector(tmp_path):
    server, failure = start_fake(tmp_path, "--hang-after-s", "2", "--hang-style", "exit")
    try:
        assert failure is None
        load = LoadDriver(server.base_url, workload(), seed=0, duration_s=60).start()
        dog = Watchdog(server, load, config=FAST)
        verdict = dog.watch(until=time.monotonic() + 60)
        load.stop()
        dog.close()
    finally:
        server.stop(grace_s=2)
    assert verdict is not None and verdict.kind == "crash" and verdict.detector in ("exit", "logs")
    timeline = (tmp_path / "watchdog.jsonl").read_text()
    assert '"verdict"' in timeline and '"health": 200' in timeline


class Scripted:
    """A server whose /metrics, log and exit code follow a script (no process, no socket)."""
    def __init__(self, tmp_path):
        self.base_url = "http://scripted"
        self.log_path = tmp_path / "server.log"
        self.log_path.write_text("")
        self.tokens, self.running, self.exit_code = 0, 3, None

    def poll(self):
        return self.exit_code

    def get(self, url, timeout_s):
        if url.endswith("/health"):
            return 200, ""
        return 200, (f"vllm:generation_tokens_total {self.tokens}\nvllm:num_requests_running {self.running}\n")


def test_a_log_verdict_is_dated_to_the_last_progress_and_names_the_other_detectors(tmp_path):
    server = Scripted(tmp_path)
    clock = [1000.0]
    dog = Watchdog(server, None, build_detectors(["progress", "logs", "exit"]),
                   WatchdogConfig(scrape_every_s=0.01), clock=lambda: clock[0], get=server.get)
    dog.start()
    try:
        for _ in range(5):
            server.tokens += 10
            time.sleep(0.05)
            clock[0] += 1
            assert dog.tick() is None
        progress_at = dog.last_progress_at
        with open(server.log_path, "a") as f:
            f.write("ERROR RuntimeError: CUDA error: an illegal memory access was encountered\n")
        server.exit_code = 1
        clock[0] += 1
        verdict = dog.tick()
    finally:
        dog.close()
    assert verdict.detector == "logs" and verdict.kind == "crash" and verdict.hint == "cuda_error"
    assert verdict.since == progress_at                         # filled in from the last progress
    assert any(a.startswith("exit: ") for a in verdict.details["also"])
    assert '"verdict": "logs"' in (tmp_path / "watchdog.jsonl").read_text()
