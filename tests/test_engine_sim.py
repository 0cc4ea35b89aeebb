"""`SimEngine`: the Engine protocol's simulated engine, and that its command really serves."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest

from soakmatrix.jobs.engines import get_engine
from soakmatrix.jobs.engines.sim import SimEngine
from soakmatrix.jobs.server_process import free_port
from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.workloads import Workload


def spec(tmp_path, **kw) -> SoakSpec:
    flags = {"mtp": 1, "tp": 2, "cudagraph_mode": "FULL_DECODE_ONLY"}
    serve_args, env = flagmod.build_argv(flags)
    base = dict(cell_id="c1", cell_name="m|H200|mtp=1|w", model="m", model_path="org/m", gpu_type="H200",
                gpu_count=2, workload=Workload("w", "random", {}), flags=flags, serve_args=tuple(serve_args),
                env={"VLLM_LOG_STATS_INTERVAL": "1", **env}, artifacts_dir=str(tmp_path / "cell"), seed=9,
                time_scale=60.0)
    base.update(kw)
    return SoakSpec(**base)


def test_command_contract(tmp_path) -> None:
    s = spec(tmp_path)
    cmd = SimEngine().command(s, "127.0.0.1", 8123)
    assert cmd.argv == [sys.executable, "-m", "soakmatrix.jobs.sim", "org/m", *s.serve_args,
                        "--host", "127.0.0.1", "--port", "8123", "--gpu-type", "H200", "--seed", "9",
                        "--time-scale", "60.0", "--hang-record", f"{tmp_path / 'cell'}/sim-hangs.jsonl"]
    assert cmd.env["VLLM_LOG_STATS_INTERVAL"] == "1"
    with_model = SimEngine().command(spec(tmp_path, hang_model="hangs.yaml"), "127.0.0.1", 1)
    assert with_model.argv[-2:] == ["--hang-model", "hangs.yaml"]


def test_registered_and_versioned() -> None:
    engine = get_engine("sim")
    assert isinstance(engine, SimEngine) and engine.name == "sim"
    assert engine.version() == "sim 0.1.0"


def test_the_command_parses_to_the_cells_flags(tmp_path) -> None:
    from soakmatrix.jobs.sim.args import parse_sim_argv

    s = spec(tmp_path)
    argv = SimEngine().command(s, "127.0.0.1", 8123).argv[3:]
    config = parse_sim_argv(argv, environ={})
    assert config.flags == flagmod.resolve_defaults(s.flags)
    assert (config.model, config.gpu_type, config.seed, config.time_scale) == ("org/m", "H200", 9, 60.0)


@pytest.mark.slow
def test_the_command_serves(tmp_path) -> None:
    port = free_port()
    cmd = SimEngine().command(spec(tmp_path), "127.0.0.1", port)
    import os
    proc = subprocess.Popen(cmd.argv, env={**os.environ, **cmd.env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail("not ready")
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
