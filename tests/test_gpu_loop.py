"""The soak job on a real GPU: a vLLM-shaped tree (API server, `VLLM::EngineCore`, `VLLM::Worker_TP0/1`
as separate processes, torch on the device in each; the simulated engine with `--torch-device`) hangs
three ways, and the soak job's own detection must catch each: a CUDA event sync behind a spinning
kernel (`event_sync_stall`, GPU busy), a worker in an all-reduce its peer never joins
(`collective_stall`), a host-side stall in the scheduler with the GPU idle (`silent_stall`); each with
native frames and NVML state in its evidence, three fingerprints, and nothing left behind: no
process, no GPU memory. `make test-gpu` runs them; without torch and a CUDA device they skip, saying why.
"""

from __future__ import annotations

import time

import psutil
import pytest

from soakmatrix.jobs.soak import SoakOptions, run_cell

from tests.gpu_loop import SCENARIOS, gpu_unavailable, leftovers, problems, read_text, spec_for


def _import_torch():
    import torch

    return torch


def _import_nvml():
    import pynvml

    return pynvml


UNAVAILABLE = gpu_unavailable(_import_torch, _import_nvml)
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(UNAVAILABLE is not None, reason=f"needs torch and a CUDA GPU: {UNAVAILABLE}")]


def nvml_snapshot() -> tuple[int, list[dict]]:
    """(memory used on GPU 0, its compute processes) through NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        procs = [{"pid": p.pid, "used_memory": p.usedGpuMemory}
                 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return used, procs
    finally:
        pynvml.nvmlShutdown()


def settled(pids, wait_s: float = 15.0) -> tuple[int, list[dict]]:
    """NVML's view once the driver has let go of the tree's contexts (it frees them a moment after
    the processes exit), or after `wait_s`: what is left then is left behind."""
    deadline = time.monotonic() + wait_s
    while True:
        used, procs = nvml_snapshot()
        if not {p["pid"] for p in procs} & set(pids) or time.monotonic() > deadline:
            return used, procs
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """Each scenario run once through `run_cell`, with NVML's memory before and after it."""
    out = {}
    for scenario in SCENARIOS:
        before, _ = nvml_snapshot()
        result = run_cell(spec_for(tmp_path_factory.mktemp(scenario.name), scenario), options=SoakOptions(drain_s=5))
        after, procs = settled(result.teardown.get("pids") or [])
        out[scenario.name] = (scenario, result, before, after, procs)
    return out


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_the_soak_job_catches_each_gpu_hang_with_its_evidence(cells, name):
    scenario, result, *_ = cells[name]
    assert problems(result, scenario, read_text(result.artifacts.get("py_spy"))) == []


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_teardown_leaves_no_process_and_no_gpu_memory(cells, name):
    _, result, before, after, procs = cells[name]
    pids = result.teardown["pids"]
    assert pids and result.teardown["clean"], result.teardown
    alive = lambda p: psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE   # noqa: E731
    assert leftovers(pids, alive, procs, before, after) == []


def test_three_bugs_three_fingerprints(cells):
    prints = {name: cell[1].fingerprint for name, cell in cells.items()}
    assert len(set(prints.values())) == len(SCENARIOS), prints
