"""The GPU tests' plan and checks (tests/test_gpu_loop.py), kept apart so that CPU tests try them.

A vLLM-shaped tree is the simulated engine on a real GPU (`--torch-device`, jobs/sim/torch_device.py):
the API server, `VLLM::EngineCore` and `VLLM::Worker_TP0/1` as separate processes, torch on the
device in each. Each scenario plants one hang through a hang-model file and says what the soak job's
own detection must find: signature, where the culprit is, which native frames py-spy must show,
whether NVML sees the GPU busy. `problems` and `leftovers` turn a finished cell into the list of what
is wrong, from their inputs alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.workloads import Workload, params_of

TP = 2                      # two workers, one GPU: a lost collective needs a peer
DEVICE = "cuda:0"
LEFTOVER_MEMORY_BYTES = 256 * 2**20   # NVML's used memory may differ this much from before the cell


@dataclass(frozen=True)
class Scenario:
    name: str
    style: str                 # the hang model's style that plants it
    signature: str             # what the soak job must classify it as
    culprit_role: str          # where the culprit thread must be
    native: str                # a regex py-spy's --native frames of the culprit must match
    gpu: str                   # "busy" | "idle" as NVML must see it at the hang


SCENARIOS = (
    Scenario("event_sync", "event_sync_stall", "event_sync_stall", "EngineCore",
             r"\bcu(?:da)?EventSynchronize\b", "busy"),
    Scenario("lost_collective", "shm_broadcast", "collective_stall", "Worker_TP1",
             r"\b(?:gloo::|c10d::)", "idle"),
    Scenario("host_stall", "silent_stall", "silent_stall", "EngineCore", r"\(lib(?:c|pthread)[-.]", "idle"),
)


def hang_model(scenario: Scenario) -> str:
    """A hang-model file that plants the scenario's hang after a few seconds of load."""
    return (f"seed: 5\nhangs:\n  - id: gpu-{scenario.name}\n    style: {scenario.style}\n    when: {{}}\n"
            f"    min_running: 1\n    mttf_s: 4\n")


def spec_for(folder: Path, scenario: Scenario, device: str = DEVICE) -> SoakSpec:
    """The cell that runs `scenario`: TP 2 on one device, torch driving it, its hang model in `folder`."""
    model = folder / f"{scenario.name}-hangs.yaml"
    model.write_text(hang_model(scenario))
    argv, env = flagmod.build_argv({"tp": TP})
    defaults = {k: d for k, (_, d) in params_of("random").items()}
    workload = Workload("random-w", "random", {**defaults, "concurrency": 4, "input_len": [5, 30],
                                               "output_len": [20, 80]})
    return SoakSpec(cell_id=scenario.name, cell_name=f"sim|{device}|{scenario.name}", model="sim-gpu",
                    model_path="sim-gpu", gpu_type="gpu", gpu_count=1, workload=workload, flags={"tp": TP},
                    serve_args=(*argv, "--torch-device", device), env=env, soak_s=120, startup_timeout_s=180,
                    backend="sim", hang_model=str(model), artifacts_dir=str(folder / "cells" / scenario.name))


def gpu_unavailable(import_torch: Callable[[], Any], import_nvml: Callable[[], Any]) -> str | None:
    """Why the GPU tests cannot run here, or None when torch sees a CUDA device and NVML reads it."""
    try:
        torch = import_torch()
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.version.cuda: {torch.version.cuda})"
    try:
        nvml = import_nvml()
        nvml.nvmlInit()
        nvml.nvmlShutdown()
    except Exception as exc:   # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded
        return f"NVML is not readable ({type(exc).__name__}: {exc})"
    return None


def culprit_frames(result: Any) -> list[str]:
    for thread in result.threads or []:
        if thread.get("kind") == "culprit":
            return list(thread.get("frames", []))
    return list(result.stuck_frames or [])


def problems(result: Any, scenario: Scenario, pyspy_text: str | None, nvml: bool = True) -> list[str]:
    """What the finished cell `result` (a CellResult) got wrong about `scenario`; empty when nothing.
    `nvml`: whether the GPU state must have been measured (False for the tree with torch on the CPU)."""
    out = []
    outcome = getattr(result.outcome, "value", result.outcome)
    if outcome != "hang":
        out.append(f"outcome {outcome}, not hang: {result.message}")
    if result.signature != scenario.signature:
        out.append(f"signature {result.signature}, not {scenario.signature}")
    planted = result.true_hang.get("signature")
    if planted is not None and planted != scenario.signature:
        out.append(f"the simulator planted {planted}, not {scenario.signature}")
    if not result.fingerprint:
        out.append("no fingerprint")
    if not (result.culprit or "").startswith(scenario.culprit_role):
        out.append(f"culprit {result.culprit!r}, not in {scenario.culprit_role}")
    frames = culprit_frames(result)
    if not any(re.search(scenario.native, f) for f in frames):
        out.append(f"no native frame matching {scenario.native} in the culprit's frames {frames[:12]}")
    if pyspy_text is None:
        out.append("no py-spy dump in the evidence")
    elif not re.search(r"Process \d+: VLLM::Worker_TP1", pyspy_text):
        out.append("py-spy did not dump Worker_TP1: the tree was not vLLM-shaped")
    gpu = result.gpu_state or {}
    if not nvml:
        return out
    if not gpu.get("measured"):
        out.append(f"NVML did not measure the GPU: {gpu.get('note', 'no gpu_state')}")
    elif gpu.get("state") != scenario.gpu:
        out.append(f"NVML saw the GPU {gpu.get('state')}, not {scenario.gpu}: {gpu.get('gpus')}")
    elif not ({p for g in gpu.get("gpus", []) for p in (q["pid"] for q in g.get("processes", []))}
              & set(_tree_pids(result))):
        out.append("NVML listed none of the engine's processes on the GPU")
    return out


def _tree_pids(result: Any) -> list[int]:
    return list(result.teardown.get("pids") or [])


def leftovers(pids: Iterable[int], alive: Callable[[int], bool], gpu_processes: Iterable[dict],
              memory_before: int | None, memory_after: int | None) -> list[str]:
    """What a cell left behind: processes of its tree still alive, GPU memory NVML still charges to
    them, and used memory above what it was before the cell (beyond LEFTOVER_MEMORY_BYTES)."""
    pids = set(pids)
    out = [f"process {p} is still alive" for p in sorted(pids) if alive(p)]
    out += [f"process {g['pid']} still holds {g.get('used_memory')} bytes of GPU memory"
            for g in gpu_processes if g["pid"] in pids]
    if memory_before is not None and memory_after is not None and memory_after - memory_before > LEFTOVER_MEMORY_BYTES:
        out.append(f"GPU memory used went from {memory_before} to {memory_after} bytes")
    return out


def read_text(path: str | None) -> str | None:
    try:
        return Path(path).read_text(errors="replace") if path else None
    except OSError:
        return None
