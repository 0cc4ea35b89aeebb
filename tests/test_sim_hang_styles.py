"""Each hang style end to end: a real server under real load hangs as the hang model says.

The clocks are scaled (`--time-scale 100`, MTTF 100 s: about a second of load), so each style takes
seconds: the ring-buffer warning comes every 0.6 s and the RPC timeout after 3 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from soakmatrix.fixtures.sim_testing import SimProcess, load, read_hang_records
from soakmatrix.jobs.sim.hangs import draw_time_to_hang
from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_hang_model

pytestmark = [pytest.mark.slow, pytest.mark.waits]

STATS = "Avg prompt throughput"
ZERO = "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s"


def hang_model(tmp_path: Path, style: str, when: str = "{mtp: [1]}", min_running: int = 2) -> Path:
    path = tmp_path / "hangs.yaml"
    path.write_text(f"seed: 11\nhangs:\n  - id: planted-{style}\n    style: {style}\n    when: {when}\n"
                    f"    min_running: {min_running}\n    mttf_s: 100\n")
    return path


def start(tmp_path: Path, style: str, *extra: str, env: dict | None = None) -> tuple[SimProcess, Path]:
    record = tmp_path / "sim-hangs.jsonl"
    args = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}', "--hang-model",
            str(hang_model(tmp_path, style)), "--time-scale", "100", "--hang-record", str(record), *extra]
    sp = SimProcess(args, tmp_path / "server.log", env=env).start()
    return sp, record


def background_load(sp: SimProcess, seconds: float, concurrency: int = 4,
                    request_timeout: float = 3.0) -> threading.Thread:
    t = threading.Thread(target=load, args=(sp.url, concurrency, seconds),
                         kwargs={"max_tokens": 48, "request_timeout": request_timeout}, daemon=True)
    t.start()
    return t


def wait_record(record: Path, timeout: float = 30.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        recs = read_hang_records(record)
        if recs:
            return recs[0]
        time.sleep(0.02)
    raise AssertionError("no hang began")


def check_record(rec: dict, style: str, started: float) -> None:
    assert rec["style"] == style and rec["hang_id"] == f"planted-{style}"
    assert rec["signature"] == STYLE_SIGNATURE[style]
    assert started < rec["began_at"] < time.time()
    assert rec["engine_time_s"] > 0 and rec["running"] >= 2


def py_spy(pid: int) -> str | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def core_pid(sp: SimProcess) -> int:
    return next(p.pid for p in sp.tree if p.name() == "VLLM::EngineCore")


@pytest.mark.parametrize("style, frames", [
    ("silent_stall", ["Scheduler.schedule"]),
    ("event_sync_stall", ["_to_list", "_TransferEvent.synchronize"]),
])
def test_silent_styles(tmp_path, style: str, frames: list[str]) -> None:
    started = time.time()
    sp, record = start(tmp_path, style)
    try:
        loader = background_load(sp, 6.0)
        rec = wait_record(record)
        check_record(rec, style, started)
        time.sleep(1.5)                                  # the stats line's last words
        m1 = sp.metrics()
        log_mark = len(sp.log())
        time.sleep(1.5)
        m2 = sp.metrics()
        assert sp.health() == 200                        # a stuck, living engine answers 200
        assert m2["vllm:num_requests_running"] > 0       # stale, as vLLM's
        assert m2["vllm:generation_tokens_total"] == m1["vllm:generation_tokens_total"]   # frozen
        assert m2["vllm:prompt_tokens_total"] == m1["vllm:prompt_tokens_total"]
        assert STATS not in sp.log()[log_mark:]          # fallen silent at INFO
        stats = [ln for ln in sp.log().splitlines() if STATS in ln]
        assert ZERO in stats[-1] and re.search(r"Running: [1-9]\d* reqs", stats[-1])
        assert "No available shared memory broadcast block" not in sp.log()
        assert "Traceback" not in sp.log()
        dump = py_spy(core_pid(sp))
        if dump is not None:                             # py-spy needs ptrace rights
            for frame in frames:
                assert frame in dump, dump
        loader.join(timeout=10)
    finally:
        code = sp.stop()
    assert code == 0 and not sp.leftover                 # SIGTERM ends a hung engine's whole tree


def test_the_engine_is_in_the_hangs_frame_while_its_record_is_still_being_written(tmp_path) -> None:
    """A record file that blocks its writer (a FIFO nobody reads yet: a disk that holds an fsync for
    seconds, as a busy host's can) must not keep the engine core out of the planted frame: its
    stacks are what classifies the hang."""
    started = time.time()
    os.mkfifo(tmp_path / "sim-hangs.jsonl")
    sp, record = start(tmp_path, "event_sync_stall")
    try:
        loader = background_load(sp, 6.0)
        # stuck, not caught passing through: each step calls _to_list, so the frame must still be
        # there a second later with no token made in between
        deadline, dump, stuck = time.monotonic() + 30, "", False
        while time.monotonic() < deadline and not stuck:
            before = sp.metrics()
            dump = py_spy(core_pid(sp))
            if dump is None:
                pytest.skip("py-spy cannot attach here (ptrace)")
            time.sleep(1.0)
            after = sp.metrics()
            stuck = ("_TransferEvent.synchronize" in dump and after["vllm:num_requests_running"] > 0
                     and after["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"])
        assert stuck, dump
        dump = py_spy(core_pid(sp))
        assert "_to_list" in dump and "_TransferEvent.synchronize" in dump, dump
        with open(record, encoding="utf-8") as fifo:    # now the record can be written, and is
            rec = json.loads(fifo.readline())
        check_record(rec, "event_sync_stall", started)
        loader.join(timeout=10)
    finally:
        code = sp.stop()
    assert code == 0 and not sp.leftover


def test_shm_broadcast(tmp_path) -> None:
    started = time.time()
    # vLLM's own timeout, pinned: at the default the scaled engine lives Clocks.EVIDENCE_WINDOW_S past
    # its first warning, longer than this test needs to wait
    sp, record = start(tmp_path, "shm_broadcast", "-tp", "2", env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "5.6"})
    statuses: list[int | None] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and sp.proc.poll() is None:
            statuses.append(sp.health(timeout=1.0))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        loader = background_load(sp, 10.0, request_timeout=20.0)   # requests wait out the RPC timeout
        rec = wait_record(record)
        check_record(rec, "shm_broadcast", started)
        workers = [p.pid for p in sp.tree if p.name().startswith("VLLM::Worker_TP")]
        assert len(workers) == 2
        time.sleep(0.5)
        core_dump, worker_dump = py_spy(core_pid(sp)), py_spy(workers[-1])   # while it waits
        assert sp.wait_for_log("EngineCore encountered a fatal error", 15)
        assert sp.proc.wait(timeout=15) == 1               # the first failed request ends the server
        loader.join(timeout=15)
    finally:
        stop.set()
        sp.stop()
    assert not sp.leftover
    log = sp.log()
    warnings = re.findall(r"INFO .*\[shm_broadcast\.py:\d+\] No available shared memory broadcast block "
                          r"found in 60 seconds\. This typically happens when some processes are hanging or "
                          r"doing some time-consuming work \(e\.g\. compilation, weight/kv cache quantization\)\.",
                          log)
    assert 2 <= len(warnings) <= 11                      # every 0.6 s for 5.6 s
    assert "TimeoutError: RPC call to sample_tokens timed out." in log
    assert re.search(r"shm_broadcast\.py\", line \d+, in acquire_read", log)
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) " \
           "for the root cause." in log
    assert "Dumping scheduler stats: SchedulerStats(num_running_reqs=" in log
    assert log.index("No available shared memory") < log.index("RPC call to sample_tokens timed out")
    assert 503 in statuses and statuses.index(503) > statuses.index(200)
    assert re.search(r'"POST /v1/completions HTTP/1.1" 200|"GET /health HTTP/1.1" 503', log)
    if core_dump is not None:                            # py-spy needs ptrace rights
        assert "MessageQueue.acquire_read" in core_dump and "Executor.sample_tokens" in core_dump, core_dump
    if worker_dump is not None:
        assert "sample_tokens_stuck" in worker_dump, worker_dump


def test_shm_broadcast_tp1_and_keep_alive(tmp_path) -> None:
    """TP = 1: the core's model-runner thread goes silent; with keep-alive, /health stays 503, requests 500."""
    sp, record = start(tmp_path, "shm_broadcast", env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1",
                                                       "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "5.6"})
    try:
        loader = background_load(sp, 5.0, request_timeout=20.0)
        wait_record(record)
        assert sp.wait_for_log("EngineDeadError", 15)
        loader.join(timeout=15)
        assert sp.health() == 503
        req = urllib.request.Request(sp.url + "/v1/completions", data=b'{"prompt": "x", "max_tokens": 2}',
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 500
        assert sp.proc.poll() is None
    finally:
        sp.stop()
    assert not sp.leftover


def test_crash(tmp_path) -> None:
    started = time.time()
    sp, record = start(tmp_path, "crash", "-tp", "2")
    try:
        loader = background_load(sp, 6.0)
        rec = wait_record(record)
        check_record(rec, "crash", started)
        assert sp.proc.wait(timeout=15) != 0
        loader.join(timeout=10)
    finally:
        sp.stop()
    assert not sp.leftover
    log = sp.log()
    assert re.search(r"\(EngineCore_DP0 pid=\d+\) ERROR .* EngineCore encountered a fatal error\.", log)
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    assert "vllm.v1.engine.exceptions.EngineDeadError" in log
    assert "No available shared memory" not in log


def test_no_hang_when_flags_do_not_match(tmp_path) -> None:
    record = tmp_path / "sim-hangs.jsonl"
    args = ["--hang-model", str(hang_model(tmp_path, "silent_stall")), "--time-scale", "100",
            "--hang-record", str(record)]                # mtp 0: the hang's `when` is not met
    with SimProcess(args, tmp_path / "server.log") as sp:
        results = load(sp.url, 4, 2.5, max_tokens=16)
        assert results and all(r["status"] == 200 and not r["error"] for r in results)
    assert not record.exists()


def test_gpu_type_gates_a_hang(tmp_path) -> None:
    path = tmp_path / "hangs.yaml"
    path.write_text("seed: 1\nhangs:\n  - id: h200-only\n    style: silent_stall\n    when: {}\n    gpu: [H200]\n"
                    "    min_running: 1\n    mttf_s: 50\n")
    for gpu, hangs in (("RTX5090", False), ("H200", True)):
        record = tmp_path / f"{gpu}.jsonl"
        args = ["--hang-model", str(path), "--time-scale", "100", "--hang-record", str(record)]
        with SimProcess(args, tmp_path / f"{gpu}.log", env={"SOAKMATRIX_GPU_TYPE": gpu}) as sp:
            load(sp.url, 2, 2.5, max_tokens=16, request_timeout=2.0)
        assert bool(read_hang_records(record)) is hangs, gpu


def test_same_seed_hangs_at_the_same_load(tmp_path) -> None:
    """The time to hang is drawn from the seeds: two runs of one command line hang after the same
    qualifying load. Compared: the draw and the hang clock when it fired, not `engine_time_s`, which
    also counts the moments with one request running (min_running is 2): how long those last depends
    on how the load's clients and the API server get the CPU, not on the seeds."""
    records = []
    for run in range(2):
        d = tmp_path / str(run)
        d.mkdir()
        sp, record = start(d, "silent_stall", "--seed", "5")
        try:
            background_load(sp, 5.0)
            records.append(wait_record(record))
        finally:
            sp.stop()
    model = load_hang_model(tmp_path / "0" / "hangs.yaml")
    flags = {"mtp": 1}
    drawn = draw_time_to_hang(model.hangs[0], flags, model.seed, 5, time_scale=100)
    assert drawn != pytest.approx(draw_time_to_hang(model.hangs[0], flags, model.seed, 6, time_scale=100))
    for rec in records:
        assert rec["fires_after_s"] == pytest.approx(drawn)   # the seeds' draw, nothing else
        # the clock fired when it passed the draw: at most one loop iteration late (a few ms; 0.5 s
        # leaves room for an engine core descheduled on a loaded machine)
        assert drawn <= rec["accrued_s"] < drawn + 0.5
        assert rec["engine_time_s"] >= rec["accrued_s"]
