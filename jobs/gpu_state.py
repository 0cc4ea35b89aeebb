"""GPU state at a hang: per-GPU utilisation and memory, and whether the GPUs were busy or idle.

A wedged kernel or a stream parked on an event sync keeps the GPU busy (seed 000: 100 % utilisation
while the engine waits in `cuEventSynchronize`); a host-side or IPC deadlock leaves it idle. That one
bit separates the two kinds of bug, so it becomes the signature attribute `gpu: busy|idle`.

Read through NVML (`pynvml`, from nvidia-ml-py: pure Python, imports without a GPU), else through
`nvidia-smi --query-gpu=... --format=csv` when that is on the PATH; utilisation is sampled a few
times and the highest reading counts (NVML averages over its own short window). Without either, or
on a CPU, the state says so plainly: "no GPU: not measured". Both readers take their backend as an
argument, so tests pass a fake NVML or a fake `nvidia-smi`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

BUSY_UTILIZATION_PCT = 50  # a GPU at or above this (highest sample) is busy
SAMPLES = 3
SAMPLE_GAP_S = 0.2
SMI_FIELDS = "index,name,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw"
NOT_MEASURED = "no GPU: not measured"


@dataclass
class GpuState:
    measured: bool
    source: str = ""  # "nvml" | "nvidia-smi" | ""
    gpus: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    @property
    def busy(self) -> str | None:
        """ "busy" when any GPU of the cell was at or above BUSY_UTILIZATION_PCT, "idle" when none was,
        None when not measured."""
        if not self.measured or not self.gpus:
            return None
        utils = [u for g in self.gpus if (u := g.get("utilization_gpu")) is not None]
        if not utils:
            return None
        return "busy" if max(utils) >= BUSY_UTILIZATION_PCT else "idle"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.busy}

    def summary(self) -> str:
        if not self.measured:
            return self.note or NOT_MEASURED
        parts = [
            f"GPU{g['index']} {g.get('utilization_gpu', '?')}% util, "
            f"{_gib(g.get('memory_used'))}/{_gib(g.get('memory_total'))} GiB"
            for g in self.gpus
        ]
        return f"gpu: {self.busy or 'unknown'} ({'; '.join(parts)}) via {self.source}"


def _gib(value: Any) -> str:
    return "?" if value is None else f"{value / 2**30:.1f}"


def read_nvml(
    nvml: Any,
    pids: Sequence[int] = (),
    samples: int = SAMPLES,
    gap_s: float = SAMPLE_GAP_S,
    sleep: Callable[[float], None] = time.sleep,
) -> GpuState:
    """Every GPU NVML sees (or only those running one of `pids`, when any does)."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound on a CPU host, DriverNotLoaded, ...
        return GpuState(False, "nvml", note=f"{NOT_MEASURED} (NVML: {type(exc).__name__}: {exc})")
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        if not handles:
            return GpuState(False, "nvml", note=f"{NOT_MEASURED} (NVML sees no GPU)")
        peak = [0] * len(handles)
        mem_util = [0] * len(handles)
        for n in range(max(1, samples)):
            if n:
                sleep(gap_s)
            for i, h in enumerate(handles):
                util = nvml.nvmlDeviceGetUtilizationRates(h)
                peak[i] = max(peak[i], int(util.gpu))
                mem_util[i] = max(mem_util[i], int(util.memory))
        gpus = []
        for i, h in enumerate(handles):
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            name = nvml.nvmlDeviceGetName(h)
            try:
                procs = [
                    {"pid": p.pid, "used_memory": p.usedGpuMemory} for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)
                ]
            except Exception:  # noqa: BLE001 - a GPU whose processes NVML cannot list is still measured
                procs = []
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "utilization_gpu": peak[i],
                    "utilization_memory": mem_util[i],
                    "memory_used": int(mem.used),
                    "memory_total": int(mem.total),
                    "processes": procs,
                }
            )
        return GpuState(True, "nvml", _ours(gpus, pids))
    except Exception as exc:  # noqa: BLE001 - evidence at a hang: a failure is noted, never raised
        return GpuState(False, "nvml", note=f"NVML failed: {type(exc).__name__}: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the state is read; a failed shutdown changes nothing
            pass


def _ours(gpus: list[dict[str, Any]], pids: Sequence[int]) -> list[dict[str, Any]]:
    """The GPUs the server's processes run on, when NVML lists them; else every GPU."""
    wanted = set(pids)
    mine = [g for g in gpus if wanted & {p["pid"] for p in g.get("processes", [])}]
    return mine or gpus


def read_nvidia_smi(
    runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    exe: str = "nvidia-smi",
    timeout_s: float = 15.0,
) -> GpuState:
    """`nvidia-smi --query-gpu=... --format=csv,noheader,nounits` (one sample)."""
    try:
        done = runner(
            [exe, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuState(False, "nvidia-smi", note=f"nvidia-smi failed: {exc}")
    if done.returncode != 0:
        return GpuState(False, "nvidia-smi", note=f"nvidia-smi exit {done.returncode}: {done.stderr.strip()[:200]}")
    gpus = []
    for line in done.stdout.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 6:
            continue
        gpus.append(
            {
                "index": _num(cells[0]),
                "name": cells[1],
                "utilization_gpu": _num(cells[2]),
                "utilization_memory": _num(cells[3]),
                "memory_used": _mib(cells[4]),
                "memory_total": _mib(cells[5]),
                "power_w": _num(cells[6]) if len(cells) > 6 else None,
            }
        )
    if not gpus:
        return GpuState(False, "nvidia-smi", note=f"{NOT_MEASURED} (nvidia-smi lists no GPU)")
    return GpuState(True, "nvidia-smi", gpus)


def _num(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
    return int(value) if value.is_integer() else value


def _mib(text: str) -> int | None:
    value = _num(text)
    return None if value is None else int(value * 2**20)


def measure(pids: Sequence[int] = (), nvml: Any = None, smi: Callable[[], GpuState] | None = None) -> GpuState:
    """The GPU state now: NVML, else nvidia-smi, else not measured (said plainly)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            nvml = None
    state = read_nvml(nvml, pids) if nvml is not None else GpuState(False, note=f"{NOT_MEASURED} (no pynvml)")
    if state.measured:
        return state
    if smi is not None:
        return smi()
    if shutil.which("nvidia-smi"):
        return read_nvidia_smi()
    return GpuState(False, state.source, note=state.note or NOT_MEASURED)
