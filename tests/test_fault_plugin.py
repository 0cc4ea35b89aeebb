"""The fault-injection plugin: inert without SOAKMATRIX_FAULTS; with it, the right hang fires at the
right call, after exposure under load, writes its record and parks in a frame py-spy shows.

The planted behaviour runs in child processes against a stand-in `vllm` package (the same class and
method names as vLLM 0.32), so a stuck or killed process is never the test runner. The real vLLM's
config objects and entry point are checked in the `vllm`-marked tests at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace as NS

import psutil
import pytest

from soakmatrix.fixtures import fault_plugin as fp
from soakmatrix.jobs import hang_arming
from soakmatrix.jobs.sim import hangs as sim_hangs
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_hang_model

REPO = Path(__file__).resolve().parent.parent


def config(**over):
    """A stand-in for vLLM's VllmConfig with the attributes the readers use."""
    c = NS(scheduler_config=NS(async_scheduling=False, enable_chunked_prefill=True, max_num_seqs=8,
                               max_num_batched_tokens=2048),
           cache_config=NS(enable_prefix_caching=False, cache_dtype="auto"),
           compilation_config=NS(cudagraph_mode=NS(name="NONE")),
           speculative_config=None, kernel_config=NS(enable_flashinfer_autotune=True),
           parallel_config=NS(tensor_parallel_size=1, enable_expert_parallel=False),
           model_config=NS(enforce_eager=True))
    for k, v in over.items():
        setattr(c, k, v)
    return c


def hang_file(tmp_path: Path, style: str, when: str = "{prefix_caching: false}", mttf: float = 0.3,
              min_running: int = 2, extra: str = "") -> Path:
    path = tmp_path / f"hangs-{style}.yaml"
    path.write_text(textwrap.dedent(f"""\
        seed: 3
        hangs:
          - id: planted-{style}
            style: {style}
            when: {when}
            min_running: {min_running}
            mttf_s: {mttf}
        {extra}"""))
    return path


# -- pure parts ----------------------------------------------------------------------------------------

def test_config_objects_map_to_canonical_flags():
    flags = fp.canonical_flags(config(speculative_config=NS(method="ngram", num_speculative_tokens=3)))
    assert flags == {"async_scheduling": False, "cudagraph_mode": "NONE", "mtp": 0, "ngram": 3,
                     "flashinfer_autotune": True, "tp": 1, "prefix_caching": False, "chunked_prefill": True,
                     "kv_cache_dtype": "auto", "enforce_eager": True, "expert_parallel": False,
                     "max_num_seqs": 8, "max_num_batched_tokens": 2048}
    mtp = fp.canonical_flags(config(speculative_config=NS(method="deepseek_mtp", num_speculative_tokens=1)))
    assert (mtp["mtp"], mtp["ngram"]) == (1, 0)


def test_a_setting_this_vllm_lacks_is_left_out_so_it_never_matches():
    c = config()
    del c.kernel_config
    assert "flashinfer_autotune" not in fp.canonical_flags(c)


def test_exposure_counts_only_with_enough_requests_and_caps_idle_gaps():
    clock = fp.ExposureClock(min_running=2, max_gap_s=1.0)
    clock.tick(0.0, 3)
    clock.tick(0.5, 1)       # 0.5 s with 3 running: counts
    clock.tick(0.9, 2)       # 0.4 s with 1 running: does not
    clock.tick(60.0, 2)      # the engine went idle after a step with 2: only 1 s counts
    assert clock.exposure_s == pytest.approx(1.5)


def test_arm_matches_when_gpu_and_style_and_applies_modifiers(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text(textwrap.dedent("""\
        seed: 1
        hangs:
          - {id: a, style: silent_stall, when: {prefix_caching: false}, mttf_s: 100,
             modifiers: [{when: {enforce_eager: true}, mttf_factor: 8}]}
          - {id: b, style: shm_broadcast, when: {prefix_caching: false}, mttf_s: 100}
          - {id: c, style: silent_stall, when: {prefix_caching: false}, gpu: [H200], mttf_s: 100}
          - {id: d, style: silent_stall, when: {cudagraph_mode: FULL_AND_PIECEWISE}, mttf_s: 100}
        """))
    model = load_hang_model(path)
    flags = fp.canonical_flags(config())
    armed = fp.arm(model, flags, None, ("silent_stall",))
    assert [a.hang.id for a in armed] == ["a"]          # b: other style, c: other GPU, d: CPU said NONE
    assert armed[0].mttf_s == 800
    assert [a.hang.id for a in fp.arm(model, flags, "H200", ("silent_stall",))] == ["a", "c"]


def test_draws_are_exponential_and_reproducible():
    draws = [fp.draw_fires_after(7, str(i), "x", 50.0) for i in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(50.0, rel=0.06)
    assert fp.draw_fires_after(7, "0", "x", 50.0) == draws[0]
    assert fp.draw_fires_after(8, "0", "x", 50.0) != draws[0]


def test_the_plugin_and_the_simulated_engine_arm_alike(tmp_path):
    """One arming (jobs/hang_arming.py): for one model, flags, GPU and seed both sides carry the same
    hangs with the same MTTFs, each drawn by the shared draw in that side's own RNG namespace."""
    path = tmp_path / "h.yaml"
    path.write_text(textwrap.dedent("""\
        seed: 5
        hangs:
          - {id: a, style: silent_stall, when: {prefix_caching: false}, mttf_s: 100,
             modifiers: [{when: {enforce_eager: true}, mttf_factor: 8}]}
          - {id: b, style: shm_broadcast, when: {tp: 1}, min_running: 2, mttf_s: 300}
          - {id: c, style: event_sync_stall, when: {prefix_caching: false}, gpu: [H200], mttf_s: 60}
          - {id: d, style: crash, when: {cudagraph_mode: NONE}, mttf_s: 50}
          - {id: e, style: silent_stall, when: {async_scheduling: true}, mttf_s: 50}
        """))
    model = load_hang_model(path)
    flags = fp.canonical_flags(config())
    for gpu in (None, "H200"):
        for seed in (0, 9):
            sim = sim_hangs.arm(model, flags, gpu, seed)
            plugin = fp.arm(model, flags, gpu, tuple(STYLE_SIGNATURE), str(seed))
            assert [(a.hang.id, a.mttf_s) for a in plugin] == [(a.hang.id, a.mttf_s) for a in sim]
            assert [a.hang.id for a in sim] == (["a", "b", "c", "d"] if gpu else ["a", "b", "d"])
            # the simulator also keys its draws on the engine (cells of a run share a seed); the plugin
            # keeps the draws the real-engine tests were written against
            identity = sim_hangs.engine_identity(flagmod.resolve_defaults(flags), gpu)
            for namespace, armed, ident in ((sim_hangs.RNG_NAMESPACE, sim, identity), (fp.RNG_NAMESPACE, plugin, "")):
                shared = hang_arming.arm(model, flags, gpu, seed, namespace, identity=ident)
                assert [a.fires_after_s for a in armed] == [a.fires_after_s for a in shared]


def test_site_fires_once_and_writes_the_hang_record(tmp_path, monkeypatch):
    record = tmp_path / "out" / "hangs.jsonl"
    monkeypatch.setenv(fp.RECORD_ENV, str(record))
    monkeypatch.delenv(fp.GPU_ENV, raising=False)
    site = fp.Site("Scheduler.schedule", ("silent_stall",),
                   load_hang_model(hang_file(tmp_path, "silent_stall", mttf=0.05)))
    fired = None
    deadline = time.monotonic() + 30
    while fired is None and time.monotonic() < deadline:
        fired = site.check(config(), running=3)
        time.sleep(0.01)
    assert fired is not None and fired.hang.id == "planted-silent_stall"
    assert site.check(config(), running=3) is fired
    fp.wait_for_records()
    lines = record.read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert {"hang_id", "style", "signature", "began_at", "running"} <= set(rec)
    assert (rec["style"], rec["signature"], rec["running"]) == ("silent_stall", "silent_stall", 3)
    assert abs(rec["began_at"] - time.time()) < 30


def test_without_the_variable_register_does_nothing(monkeypatch):
    monkeypatch.delenv(fp.FAULTS_ENV, raising=False)
    before = set(sys.modules)
    fp.register()
    assert not [m for m in set(sys.modules) - before if m.startswith("vllm")]


# -- planted behaviour in child processes --------------------------------------------------------------

FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/sched/__init__.py": "",
    "vllm/v1/core/sched/scheduler.py": """
class Scheduler:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.running = [1, 2, 3]
    def schedule(self, throttle_prefills=False):
        return "scheduled"
""",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/worker_base.py": """
class WorkerWrapperBase:
    rpc_rank = 0
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
    def execute_model(self, scheduler_output):
        return "output"
""",
    "vllm/v1/worker/gpu_model_runner.py": """
class GPUModelRunner:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
    def _to_list(self, sampled_token_ids):
        return [[1]] * sampled_token_ids.shape[0]
""",
}

DRIVER = """
import os, subprocess, sys, time
from types import SimpleNamespace as NS
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soakmatrix.fixtures import fault_plugin
role = sys.argv[1]
if role == "frontend":   # stands for the API server: starts the 'engine core' and waits
    child = subprocess.Popen([sys.executable, __file__, "crash"])
    print(child.pid, flush=True)
    while True:
        time.sleep(0.5)
fault_plugin.register()
cfg = NS(scheduler_config=NS(async_scheduling=False, enable_chunked_prefill=True, max_num_seqs=8,
                             max_num_batched_tokens=2048),
         cache_config=NS(enable_prefix_caching=False, cache_dtype="auto"),
         compilation_config=NS(cudagraph_mode=NS(name="NONE")), speculative_config=None,
         kernel_config=NS(enable_flashinfer_autotune=True),
         parallel_config=NS(tensor_parallel_size=1, enable_expert_parallel=False),
         model_config=NS(enforce_eager=True))
if role in ("silent_stall", "crash"):
    from vllm.v1.core.sched.scheduler import Scheduler
    step = Scheduler(cfg).schedule
elif role == "shm_broadcast":
    from vllm.v1.worker.worker_base import WorkerWrapperBase
    worker = WorkerWrapperBase(cfg)
    step = lambda: worker.execute_model(NS(num_scheduled_tokens={"a": 1, "b": 1, "c": 1}))
else:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    runner = GPUModelRunner(cfg)
    step = lambda: runner._to_list(NS(shape=(3, 1)))
print("stepping", flush=True)
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3000):
    step()
    time.sleep(0.002)
print("no hang", flush=True)
"""


@pytest.fixture
def fake_vllm(tmp_path) -> Path:
    for rel, text in FAKE_VLLM.items():
        path = tmp_path / "fake" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (tmp_path / "fake" / "driver.py").write_text(DRIVER)
    return tmp_path / "fake"


def start(fake: Path, role: str, hangs: Path | None, record: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, fp.RECORD_ENV: str(record), "PYTHONPATH": str(fake)}
    env.pop(fp.FAULTS_ENV, None)
    if hangs is not None:
        env[fp.FAULTS_ENV] = str(hangs)
    return subprocess.Popen([sys.executable, str(fake / "driver.py"), role, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_record(record: Path, proc: subprocess.Popen, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if record.exists() and record.read_text().strip():
            return json.loads(record.read_text().splitlines()[0])
        if proc.poll() is not None and not record.exists():
            pytest.fail(f"exited {proc.returncode} without a hang: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail("the planted hang never fired")


def stack_of(pid: int) -> str:
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy is not installed")
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"py-spy cannot read the process here: {out.stderr.strip()[:200]}")
    return out.stdout


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


@pytest.mark.parametrize("style, frames", [
    ("silent_stall", ["planted_silent_stall", "schedule"]),
    ("event_sync_stall", ["synchronize", "_to_list"]),
    ("shm_broadcast", ["planted_worker_stall", "execute_model"]),
])
def test_planted_stall_parks_in_the_seed_frame(fake_vllm, tmp_path, style, frames):
    record = tmp_path / "record.jsonl"
    proc = start(fake_vllm, style, hang_file(tmp_path, style), record)
    try:
        rec = wait_for_record(record, proc)
        assert (rec["hang_id"], rec["style"], rec["running"]) == (f"planted-{style}", style, 3)
        time.sleep(0.5)
        assert proc.poll() is None, "a stall must block, not exit"
        stack = stack_of(proc.pid)
        names = [line.split()[0].rsplit(".", 1)[-1] for line in stack.splitlines() if line.startswith("    ")]
        for frame in frames:
            assert frame in names, stack
        assert names.index(frames[0]) < names.index(frames[1])   # innermost first
    finally:
        stop(proc)


def test_a_hang_whose_when_does_not_match_never_fires(fake_vllm, tmp_path):
    record = tmp_path / "record.jsonl"
    proc = start(fake_vllm, "silent_stall", hang_file(tmp_path, "silent_stall", when="{prefix_caching: true}"),
                 record, "300")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "no hang" in out and not record.exists()


def test_below_min_running_no_exposure_accrues(fake_vllm, tmp_path):
    record = tmp_path / "record.jsonl"
    proc = start(fake_vllm, "silent_stall", hang_file(tmp_path, "silent_stall", mttf=0.01, min_running=4),
                 record, "300")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "no hang" in out and not record.exists(), err


def test_planted_crash_kills_the_server_and_its_engine(fake_vllm, tmp_path):
    record = tmp_path / "record.jsonl"
    frontend = start(fake_vllm, "frontend", hang_file(tmp_path, "crash"), record)
    try:
        engine_pid = int(frontend.stdout.readline())
        rec = wait_for_record(record, frontend)
        assert (rec["style"], rec["signature"]) == ("crash", "crash")
        assert frontend.wait(timeout=60) == -9
        deadline = time.monotonic() + 30
        while psutil.pid_exists(engine_pid) and psutil.Process(engine_pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the engine process survived its planted crash"
            time.sleep(0.1)
        assert "soakmatrix planted crash" in frontend.stderr.read()
    finally:
        stop(frontend)


# -- against the installed vLLM ------------------------------------------------------------------------

def _vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


needs_vllm = pytest.mark.skipif(not _vllm_available(), reason="vLLM is not importable (make install-vllm)")


@pytest.mark.vllm
@needs_vllm
def test_the_entry_point_is_registered_for_vllm():
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "soakmatrix_faults"]
    assert [ep.value for ep in eps] == ["soakmatrix.fixtures.fault_plugin:register"]
    assert eps[0].load() is fp.register


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_readers_work_on_the_installed_vllms_config():
    code = textwrap.dedent("""
        import json, os
        os.environ["HF_HUB_OFFLINE"] = "1"
        from soakmatrix.fixtures.tiny_model import ensure_tiny_model
        from soakmatrix.fixtures.fault_plugin import canonical_flags, CONFIG_READERS
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        args = make_arg_parser(FlexibleArgumentParser()).parse_args([
            "--model", str(ensure_tiny_model()), "--max-model-len", "256", "--no-enable-prefix-caching",
            "--async-scheduling", "--compilation-config", '{"cudagraph_mode": "FULL"}', "--max-num-seqs", "5",
            "--kv-cache-dtype", "fp8"])
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        print("FLAGS=" + json.dumps(canonical_flags(config)))
        print("READERS=" + json.dumps(sorted(CONFIG_READERS)))
        # every site lands on this vLLM's own classes: each patched method now wraps the original
        from soakmatrix.fixtures.fault_plugin import PATCHES
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.worker.worker_base import WorkerWrapperBase
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        for patch in PATCHES.values():
            patch(None)
        wrapped = {name: hasattr(vars(cls)[method], "__wrapped__") for name, cls, method in (
            ("scheduler", Scheduler, "schedule"), ("worker", WorkerWrapperBase, "execute_model"),
            ("cpu_model_runner", CPUModelRunner, "_to_list"))}
        print("WRAPPED=" + json.dumps(wrapped))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = lambda p: json.loads(next(l for l in out.stdout.splitlines() if l.startswith(p))[len(p):])
    flags, readers = line("FLAGS="), line("READERS=")
    assert sorted(flags) == readers        # every reader finds its setting in this vLLM
    # the three planted sites (scheduler, worker step, the CPU runner's output copy) exist here
    assert line("WRAPPED=") == {"scheduler": True, "worker": True, "cpu_model_runner": True}
    # what the CPU platform made of the argv, not the argv itself
    assert flags["cudagraph_mode"] == "NONE" and flags["async_scheduling"] is False
    assert (flags["prefix_caching"], flags["max_num_seqs"], flags["kv_cache_dtype"]) == (False, 5, "fp8")
    assert (flags["mtp"], flags["ngram"], flags["tp"]) == (0, 0, 1)

