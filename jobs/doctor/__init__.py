"""`soakmatrix doctor`: is this node fit to run cells? A preflight a user runs by hand and a matrix
run performs once on every node it places cells on (matrix/schedule/preflight.py).

`diagnose` runs the pure checks (`checks.py`) over what `probes.py` read. Which checks apply depends
on the backend: the real engine needs everything (GPUs of the matrix's type and free, NVML, ptrace
for py-spy, /dev/shm for TP, vLLM built for the driver's CUDA, no fatal Xid), except where it is
vLLM's CPU build on a machine without GPUs (`cpu_build`: ptrace, /dev/shm and vLLM's import); the
simulated engine runs on fake GPU types and no GPU, so it is checked for ptrace alone (py-spy's
evidence is as real there). A report's `failed` says whether cells placed here would be worth running.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import checks as c
from . import probes as p

GPU_BACKENDS = ("vllm",)


@dataclass(frozen=True)
class DoctorReport:
    node: str
    backend: str
    checks: tuple[c.Check, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> tuple[c.Check, ...]:
        return tuple(x for x in self.checks if x.status == c.FAIL)

    @property
    def warned(self) -> tuple[c.Check, ...]:
        return tuple(x for x in self.checks if x.status == c.WARN)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        """One line for a cell's message: what failed, else ok."""
        if self.failed:
            return f"node {self.node} failed its preflight: " + "; ".join(f"{x.name}: {x.detail}" for x in self.failed)
        return f"node {self.node} preflight ok" + (f" ({len(self.warned)} warning(s))" if self.warned else "")

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "backend": self.backend,
            "ok": self.ok,
            "checks": [x.to_dict() for x in self.checks],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict) -> DoctorReport:
        return cls(
            data["node"], data["backend"], tuple(c.Check(**x) for x in data["checks"]), tuple(data.get("notes", ()))
        )

    def text(self) -> str:
        width = max((len(x.name) for x in self.checks), default=4)
        lines = [f"soakmatrix doctor: node {self.node}, backend {self.backend}"]
        lines += [f"  {x.status.upper():4}  {x.name:<{width}}  {x.detail}" for x in self.checks]
        lines += [f"  note: {n}" for n in self.notes]
        verdict = "FAIL" if self.failed else ("ok, with warnings" if self.warned else "ok")
        lines.append(
            f"{verdict}: {len(self.failed)} failed, {len(self.warned)} warned, "
            f"{len(self.checks) - len(self.failed) - len(self.warned)} ok"
        )
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Probes:
    """Everything the checks read, gathered once (tests build it by hand)."""

    nvml: c.NvmlProbe
    ptrace_scope: int | None
    cap_eff: int | None
    shm: p.ShmProbe
    vllm: c.VllmProbe | None  # None when the backend does not need vLLM (not probed: it is slow)
    kernel_log: c.KernelLog


def gather(backend: str, read_vllm: Callable[[], c.VllmProbe] = p.read_vllm) -> Probes:
    """Read this node (only what `backend` needs: NVML, /dev/shm, vLLM and the kernel log are not
    read for the simulated engine)."""
    gpu = backend in GPU_BACKENDS
    return Probes(
        nvml=p.read_nvml() if gpu else c.NvmlProbe(error="not probed"),
        ptrace_scope=p.read_ptrace_scope(),
        cap_eff=p.read_cap_eff(),
        shm=p.read_shm() if gpu else p.ShmProbe(None, None, "not probed"),
        vllm=read_vllm() if gpu else None,
        kernel_log=p.read_kernel_log() if gpu else c.KernelLog(error="not probed"),
    )


def diagnose(
    probes: Probes,
    backend: str,
    node: str,
    expected: c.GpuExpectation | None = None,
    own_pids: Sequence[int] = (),
    gpu_indices: Sequence[int] | None = None,
) -> DoctorReport:
    """The checks that apply to `backend`; `gpu_indices` limits the free-GPU check to a cell's GPUs."""
    ptrace = c.ptrace_allowed(probes.ptrace_scope, probes.cap_eff)
    if backend not in GPU_BACKENDS:
        return DoctorReport(node, backend, (ptrace,), (f"GPU checks not run: the {backend} backend uses no GPU",))
    shm = c.shm_size(probes.shm.total, probes.shm.free, probes.shm.error)
    v = probes.vllm
    if v is not None and cpu_build(probes):
        vllm = (
            c.vllm_build(v, None)
            if v.timed_out
            else c.Check("vllm", c.OK, f"vLLM {v.vllm_version}, torch {v.torch_version}: a CPU build")
        )
        return DoctorReport(
            node,
            backend,
            (ptrace, shm, vllm),
            ("no GPU on this node: vLLM's CPU build runs on the CPU, GPU checks not run",),
        )
    nvml = c.nvml_readable(probes.nvml)
    checks = [nvml]
    if nvml.status != c.FAIL:
        checks += [c.gpu_type(probes.nvml, expected), c.gpus_free(probes.nvml, own_pids, gpu_indices)]
    checks += [
        ptrace,
        shm,
        c.vllm_build(probes.vllm or c.VllmProbe(error="not probed"), probes.nvml.driver_cuda),
        c.xid_errors(probes.kernel_log),
    ]
    return DoctorReport(node, backend, tuple(checks))


def cpu_build(probes: Probes) -> bool:
    """vLLM's CPU build on a machine without GPUs (no GPU through NVML, vLLM imports, its torch is
    built for no CUDA): the real engine runs there on the CPU, so the GPU checks do not apply. A node
    with GPUs and a CPU build is not this: there the `vllm` check fails."""
    v = probes.vllm
    no_gpu = probes.nvml.error is not None or not probes.nvml.gpus
    if v is None or not no_gpu:
        return False
    # an import too slow to finish on a loaded machine is not taken for a broken one
    return v.timed_out or (v.error is None and bool(v.vllm_version) and not v.torch_cuda)


def run_doctor(
    backend: str = "vllm",
    expected: c.GpuExpectation | None = None,
    gpu_indices: Sequence[int] | None = None,
    full_import: bool = True,
) -> DoctorReport:
    """Probe this node and check it (what the CLI and a run's cell tasks call; a run's tasks only
    find vLLM, `full_import=False`, to keep the preflight cheap)."""
    import socket
    from functools import partial

    probes = gather(backend, partial(p.read_vllm, full_import=full_import))
    return diagnose(probes, backend, socket.gethostname(), expected, own_pids=(os.getpid(),), gpu_indices=gpu_indices)
