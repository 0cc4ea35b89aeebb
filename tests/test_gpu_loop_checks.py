"""The GPU loop's plan and checks without a GPU: why it skips, what a cell must show, what counts as
left behind; and the vLLM-shaped tree itself with torch on the CPU, where its lost collective and
its host deadlock are caught as the GPU run must catch them (skipped without torch)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from soakmatrix.jobs.engines.sim import SimEngine
from soakmatrix.jobs.signatures import classify, clues_from_texts
from soakmatrix.jobs.sim.args import SimUsageError, parse_sim_argv
from soakmatrix.matrix.contracts.result import CellResult

from tests.gpu_loop import (LEFTOVER_MEMORY_BYTES, SCENARIOS, gpu_unavailable, leftovers, problems, read_text,
                            spec_for)

PYSPY = Path(__file__).resolve().parent / "data" / "pyspy"
SCENARIO = {s.name: s for s in SCENARIOS}


def fake_torch(cuda: bool):
    return SimpleNamespace(__version__="2.9.0", version=SimpleNamespace(cuda="12.8" if cuda else None),
                           cuda=SimpleNamespace(is_available=lambda: cuda))


class FakeNvml:
    def __init__(self, fails: Exception | None = None):
        self.fails = fails

    def nvmlInit(self):
        if self.fails:
            raise self.fails

    def nvmlShutdown(self):
        pass


def missing():
    raise ImportError("No module named 'torch'")


@pytest.mark.parametrize("torch, nvml, reason", [
    (missing, lambda: FakeNvml(), "torch is not installed (No module named 'torch')"),
    (lambda: fake_torch(False), lambda: FakeNvml(), "torch 2.9.0 sees no CUDA device (torch.version.cuda: None)"),
    (lambda: fake_torch(True), lambda: FakeNvml(OSError("libnvidia-ml.so.1: cannot open")),
     "NVML is not readable (OSError: libnvidia-ml.so.1: cannot open)"),
    (lambda: fake_torch(True), lambda: FakeNvml(), None),
])
def test_the_gpu_tests_say_why_they_skip(torch, nvml, reason):
    assert gpu_unavailable(torch, nvml) == reason


def collective_result(**kw) -> CellResult:
    """The recorded lost collective as the soak job would record it on a GPU node."""
    text = (PYSPY / "collective_wait_gloo_cpu_native.txt").read_text()
    cls = classify(clues_from_texts([text], verdict_kind="hang"))
    pids = [int(p) for p in __import__("re").findall(r"^Process (\d+):", text, flags=__import__("re").M)]
    base = dict(cell_id="c", cell_name="c", outcome="hang", signature=cls.signature, fingerprint=cls.fingerprint,
                stuck_frames=list(cls.stuck_frames), culprit=cls.culprit, threads=list(cls.threads),
                gpu_state={"measured": True, "state": "idle", "gpus": [{"index": 0, "processes": [
                    {"pid": pids[-1], "used_memory": 600 * 2**20}]}]},
                teardown={"pids": pids, "clean": True})
    base.update(kw)
    return CellResult(**base), text


def test_a_cell_that_shows_what_the_scenario_plants_has_no_problems():
    result, text = collective_result()
    assert problems(result, SCENARIO["lost_collective"], text) == []


def test_each_thing_a_cell_can_get_wrong_is_named():
    result, text = collective_result(signature="silent_stall", gpu_state={"measured": False, "note": "no pynvml"})
    found = problems(result, SCENARIO["lost_collective"], None)
    assert found == ["signature silent_stall, not collective_stall", "no py-spy dump in the evidence",
                     "NVML did not measure the GPU: no pynvml"]
    # the event sync scenario wants CUDA frames in the engine core and a busy GPU: this cell has neither
    found = problems(collective_result()[0], SCENARIO["event_sync"], text)
    assert found[0] == "signature collective_stall, not event_sync_stall"
    assert found[1].startswith("culprit 'Worker_TP1 MainThread") and "no native frame matching" in found[2]
    assert found[3].startswith("NVML saw the GPU idle, not busy")
    stranger = collective_result(gpu_state={"measured": True, "state": "idle", "gpus": [{"processes": [
        {"pid": 1, "used_memory": 1}]}]})[0]
    assert problems(stranger, SCENARIO["lost_collective"], text) == [
        "NVML listed none of the engine's processes on the GPU"]


def test_leftovers_are_live_processes_their_gpu_memory_and_memory_not_given_back():
    assert leftovers([10, 11], lambda p: False, [{"pid": 99, "used_memory": 5}], 1000, 1000) == []
    assert leftovers([10, 11], lambda p: p == 11, [{"pid": 10, "used_memory": 512}], 0,
                     LEFTOVER_MEMORY_BYTES + 1) == [
        "process 11 is still alive", "process 10 still holds 512 bytes of GPU memory",
        f"GPU memory used went from 0 to {LEFTOVER_MEMORY_BYTES + 1} bytes"]


def test_the_cells_command_asks_the_simulated_engine_for_tp_2_on_the_device(tmp_path):
    spec = spec_for(tmp_path, SCENARIO["event_sync"])
    config = parse_sim_argv(SimEngine().command(spec, "127.0.0.1", 8000).argv[3:], environ={})
    assert config.torch_device == "cuda:0" and config.flags["tp"] == 2
    assert "style: event_sync_stall" in Path(spec.hang_model).read_text()
    with pytest.raises(SimUsageError, match=r"--torch-device: cuda, cuda:N or cpu, got 'tpu'"):
        parse_sim_argv(["m", "--torch-device", "tpu"], environ={})


@pytest.mark.slow
@pytest.mark.parametrize("name, stuck_in", [("lost_collective", "DeviceRunner.lost_all_reduce"),
                                            ("host_stall", "lock_order_deadlock")])
def test_the_tree_with_torch_on_the_cpu_is_caught_as_on_a_gpu(tmp_path, name, stuck_in):
    pytest.importorskip("torch", reason="torch is not installed: the tree's torch side is not tried")
    from soakmatrix.jobs.soak import SoakOptions, run_cell

    scenario = SCENARIO[name]
    result = run_cell(spec_for(tmp_path, scenario, device="cpu"), options=SoakOptions(drain_s=5))
    text = read_text(result.artifacts.get("py_spy"))
    assert problems(result, scenario, text, nvml=False) == [], result.message
    assert stuck_in in "\n".join(result.stuck_frames)
    assert result.true_hang["signature"] == scenario.signature    # what the simulator planted
    pids = result.teardown["pids"]
    assert len(pids) == 4 and result.teardown["clean"]    # API server, EngineCore, two workers
    alive = lambda p: psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE   # noqa: E731
    assert leftovers(pids, alive, [], None, None) == []
