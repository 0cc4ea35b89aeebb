"""GPU state at a hang: NVML (a fake one here), nvidia-smi's CSV, and plainly "not measured" on a CPU;
`gpu: busy|idle` as the signature's attribute."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace as NS

from soakmatrix.jobs import gpu_state as gs
from soakmatrix.jobs.signatures import Clues, classify


class FakeNVML:
    """pynvml's calls the reader makes, over a list of (name, [utilisation samples], used, total, pids)."""

    def __init__(self, gpus, fail_init=None):
        self.gpus, self.fail_init, self.calls = gpus, fail_init, {}
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        n = self.calls[h] = self.calls.get(h, -1) + 1
        samples = self.gpus[h][1]
        return NS(gpu=samples[min(n, len(samples) - 1)], memory=2)

    def nvmlDeviceGetMemoryInfo(self, h):
        return NS(used=self.gpus[h][2], total=self.gpus[h][3])

    def nvmlDeviceGetName(self, h):
        return self.gpus[h][0].encode()

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [NS(pid=p, usedGpuMemory=1 << 30) for p in self.gpus[h][4]]


GIB = 1 << 30


def test_a_gpu_parked_on_an_event_sync_reads_busy():
    # seed 000: 100 % utilisation at 142 W while the engine waits in cuEventSynchronize
    nvml = FakeNVML([("NVIDIA GeForce RTX 5090", [0, 100, 100], 26 * GIB, 32 * GIB, [42])])
    state = gs.read_nvml(nvml, pids=[42], sleep=lambda s: None)
    assert state.measured and state.busy == "busy" and nvml.shut
    [gpu] = state.gpus
    assert (gpu["name"], gpu["utilization_gpu"], gpu["memory_used"]) == ("NVIDIA GeForce RTX 5090", 100, 26 * GIB)
    assert "gpu: busy" in state.summary() and "26.0/32.0 GiB" in state.summary()


def test_an_ipc_deadlock_leaves_the_gpus_idle_and_only_the_cells_gpus_count():
    nvml = FakeNVML([("H200", [0, 1, 0], 70 * GIB, 141 * GIB, [7]), ("H200", [0, 1, 0], 70 * GIB, 141 * GIB, [8]),
                     ("H200", [99, 99, 99], 70 * GIB, 141 * GIB, [999])])   # another job's GPU
    state = gs.read_nvml(nvml, pids=[7, 8], sleep=lambda s: None)
    assert [g["index"] for g in state.gpus] == [0, 1] and state.busy == "idle"


def test_without_nvml_library_it_says_not_measured():
    state = gs.read_nvml(FakeNVML([], fail_init=RuntimeError("NVML Shared Library Not Found")))
    assert not state.measured and state.busy is None
    assert state.note.startswith("no GPU: not measured") and "Library Not Found" in state.note
    assert gs.measure(nvml=FakeNVML([], fail_init=RuntimeError("x")),
                      smi=lambda: gs.GpuState(False, note=gs.NOT_MEASURED)).summary() == "no GPU: not measured"


def test_this_cpu_host_is_not_measured_plainly():
    state = gs.measure()
    if not state.measured:   # no GPU here (CI): said plainly, never an error
        assert "no GPU: not measured" in state.note or "nvidia-smi" in state.note


def test_nvidia_smi_csv_is_read_when_nvml_is_missing():
    def smi(argv, **kw):
        assert argv[1].startswith("--query-gpu=index,name,utilization.gpu")
        return subprocess.CompletedProcess(argv, 0, "0, NVIDIA GeForce RTX 5090, 100, 2, 26624, 32607, 142.45\n"
                                                    "1, NVIDIA GeForce RTX 5090, 0, 0, 1, 32607, [N/A]\n", "")
    state = gs.read_nvidia_smi(smi)
    assert state.measured and state.source == "nvidia-smi" and state.busy == "busy"
    assert state.gpus[0]["power_w"] == 142.45 and state.gpus[1]["power_w"] is None
    assert state.gpus[0]["memory_used"] == 26624 * 2**20
    failed = gs.read_nvidia_smi(lambda argv, **kw: subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed"))
    assert not failed.measured and "NVIDIA-SMI has failed" in failed.note


def test_gpu_busy_or_idle_is_a_signature_attribute_not_part_of_the_fingerprint():
    lines = ["Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 5 reqs"]
    busy = classify(Clues(log_lines=lines, verdict_kind="hang", gpu="busy"))
    idle = classify(Clues(log_lines=lines, verdict_kind="hang", gpu="idle"))
    cpu = classify(Clues(log_lines=lines, verdict_kind="hang"))
    assert busy.attributes == {"gpu": "busy"} and idle.attributes == {"gpu": "idle"} and cpu.attributes == {}
    assert busy.fingerprint == idle.fingerprint == cpu.fingerprint
