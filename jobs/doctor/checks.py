"""The node preflight's checks: each a pure function of what was probed (`probes.py` reads the node),
returning a frozen `Check` (name, ok / warn / fail, detail). A `fail` means cells placed here would
not give a verdict worth having (no GPU of the type, another job on it, a broken vLLM install, a GPU
the kernel reported lost); a `warn` means they run, with something a user should know.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

OK, WARN, FAIL = "ok", "warn", "fail"

# /dev/shm: vLLM's TP workers share each step's input through a shared-memory ring
# (shm_broadcast), torch's multiprocessing passes tensors through it, and NCCL's SHM transport puts
# its intra-node buffers there. NCCL's troubleshooting guide gives containers --shm-size=1g
# --ulimit memlock=-1; with Docker's default 64 MiB NCCL fails to initialise at TP > 1 ("NCCL WARN
# Error: failed to extend /dev/shm/nccl-... to 4194660 bytes").
SHM_MIN_BYTES = 1 << 30
# NVML's `used` on an idle GPU holds the driver's own reservation (a few hundred MiB); more than this
# with no process we may see is another container's job or memory a dead process left.
LEFTOVER_BYTES = 2 << 30
# Xids that mean the GPU or its memory is not to be trusted until the node is drained (NVIDIA's Xid
# catalogue): 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high
# single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP errors. Others (13 graphics
# engine exception, 31 MMU fault, 43 a stopped context, ...) are usually a program's fault: warned.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
XID_LINE = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<xid>\d+)")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it."""

    index: int
    name: str
    memory_used: int
    memory_total: int
    processes: tuple[tuple[int, int], ...] = ()  # (pid, used bytes) of its compute processes


@dataclass(frozen=True)
class NvmlProbe:
    """What NVML answered: the GPUs and the driver's CUDA version, or why it could not."""

    gpus: tuple[GpuInfo, ...] = ()
    driver_cuda: tuple[int, int] | None = None  # nvmlSystemGetCudaDriverVersion: 12080 -> (12, 8)
    driver_version: str = ""
    error: str | None = None  # NVML not loadable or not answering


@dataclass(frozen=True)
class GpuExpectation:
    """The matrix's GPU type this node is to run: its name, Ray label and count per node."""

    type_name: str
    ray_label: str
    count: int


@dataclass(frozen=True)
class VllmProbe:
    vllm_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda, the CUDA vLLM's wheel is built with
    error: str | None = None  # why importing vLLM failed
    timed_out: bool = False  # the import did not finish in time: not known to be broken


@dataclass(frozen=True)
class KernelLog:
    lines: tuple[str, ...] = ()
    error: str | None = None  # e.g. "dmesg: read kernel buffer failed: Operation not permitted"


def nvml_readable(nvml: NvmlProbe) -> Check:
    if nvml.error is not None:
        return Check("nvml", FAIL, f"no GPU on this node: NVML is not readable ({nvml.error})")
    if not nvml.gpus:
        return Check("nvml", FAIL, "no GPU on this node: NVML answers but lists no GPU")
    return Check(
        "nvml", OK, f"{len(nvml.gpus)} GPU(s), driver {nvml.driver_version or '?'}, CUDA {_version(nvml.driver_cuda)}"
    )


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))


def gpu_type_matches(nvml_name: str, expected: GpuExpectation) -> bool:
    """`NVIDIA H200` is H200, `NVIDIA GeForce RTX 5090` is GeForce-RTX-5090: the Ray label (or the
    type's name) is in the NVML name, punctuation and case aside. `NVIDIA H200 NVL` is an H200 too."""
    name = _normal(nvml_name)
    return any(_normal(want) and _normal(want) in name for want in (expected.ray_label, expected.type_name))


def gpu_type(nvml: NvmlProbe, expected: GpuExpectation | None) -> Check:
    names = [g.name for g in nvml.gpus]
    if not names:
        return Check("gpu_type", FAIL, "no GPU to compare" + (f" with {expected.type_name}" if expected else ""))
    kinds = sorted(set(names))
    if expected is None:
        status = WARN if len(kinds) > 1 else OK
        return Check(
            "gpu_type",
            status,
            f"{len(names)} x {', '.join(kinds)}"
            + ("; mixed types on one node" if len(kinds) > 1 else "")
            + " (no matrix type given to compare)",
        )
    matching = [n for n in names if gpu_type_matches(n, expected)]
    if not matching:
        return Check(
            "gpu_type",
            FAIL,
            f"the matrix's {expected.type_name} (ray_label {expected.ray_label}) is none of "
            f"this node's GPUs: {', '.join(kinds)}",
        )
    if len(matching) < expected.count:
        return Check(
            "gpu_type",
            FAIL,
            f"{len(matching)} {expected.type_name} GPU(s) here, the matrix says {expected.count} per node",
        )
    extra = f"; also {len(names) - len(matching)} other GPU(s)" if len(matching) < len(names) else ""
    return Check(
        "gpu_type",
        OK,
        f"{len(matching)} x {kinds[0] if len(kinds) == 1 else expected.type_name} "
        f"= the matrix's {expected.type_name}{extra}",
    )


def gpus_free(nvml: NvmlProbe, own_pids: Sequence[int] = (), indices: Sequence[int] | None = None) -> Check:
    """No other process on the GPUs and no memory held without one (a dead job's, another container's).
    `indices`: only these GPUs (the ones a cell was given; the node's others may run other cells)."""
    mine = set(own_pids)
    wanted = None if indices is None else set(indices)
    nvml = NvmlProbe(
        tuple(g for g in nvml.gpus if wanted is None or g.index in wanted),
        nvml.driver_cuda,
        nvml.driver_version,
        nvml.error,
    )
    foreign = [(g.index, pid, used) for g in nvml.gpus for pid, used in g.processes if pid not in mine]
    if foreign:
        listed = ", ".join(f"GPU{i} pid {pid} ({_gib(used)} GiB)" for i, pid, used in foreign[:6])
        return Check("gpus_free", FAIL, f"foreign processes on the GPUs: {listed}")
    held = [(g.index, g.memory_used) for g in nvml.gpus if g.memory_used > LEFTOVER_BYTES]
    if held:
        listed = ", ".join(f"GPU{i} {_gib(used)} GiB" for i, used in held)
        return Check(
            "gpus_free",
            FAIL,
            f"memory in use with no process NVML shows (another container's job, or "
            f"a dead process's): {listed}; more than {_gib(LEFTOVER_BYTES)} GiB",
        )
    if not nvml.gpus:
        return Check("gpus_free", FAIL, "no GPU to check")
    return Check("gpus_free", OK, f"{len(nvml.gpus)} GPU(s) free, none above {_gib(LEFTOVER_BYTES)} GiB used")


CAP_SYS_PTRACE = 19


def ptrace_allowed(scope: int | None, cap_eff: int | None, euid: int | None = None) -> Check:
    """py-spy attaches to the engine's processes, which are not its children. Yama's ptrace_scope 0
    allows that for the same user; 1 (children only) and 2 (admin only) need CAP_SYS_PTRACE in the
    effective set; 3 forbids it to everyone. Without it the evidence has no stacks and fingerprints
    fall back to the log's tracebacks: cells still run, so it is a warning."""
    has_cap = cap_eff is not None and bool(cap_eff >> CAP_SYS_PTRACE & 1)
    cap_text = "CAP_SYS_PTRACE " + ("in" if has_cap else "not in") + " the effective set"
    if cap_eff is None:
        cap_text = "capabilities unknown"
    if scope == 3:
        return Check("ptrace", WARN, "kernel.yama.ptrace_scope 3: no process may ptrace; py-spy gets no stacks")
    if scope in (None, 0):
        where = "no Yama (classic ptrace rules)" if scope is None else "kernel.yama.ptrace_scope 0"
        return Check("ptrace", OK, f"{where}; {cap_text}")
    if has_cap:
        return Check("ptrace", OK, f"kernel.yama.ptrace_scope {scope}; {cap_text}")
    return Check(
        "ptrace",
        WARN,
        f"kernel.yama.ptrace_scope {scope} and {cap_text}: py-spy cannot attach, the "
        "evidence has no stacks (docker run --cap-add SYS_PTRACE, Kubernetes "
        "securityContext.capabilities.add: [SYS_PTRACE], "
        "or sysctl kernel.yama.ptrace_scope=0)",
    )


def shm_size(total: int | None, free: int | None, error: str | None = None) -> Check:
    if total is None:
        return Check("shm", FAIL, f"/dev/shm is not usable ({error or 'not mounted'}): TP > 1 needs it")
    if total < SHM_MIN_BYTES or (free is not None and free < SHM_MIN_BYTES):
        return Check(
            "shm",
            FAIL,
            f"/dev/shm {_gib(total)} GiB ({_gib(free)} GiB free), "
            f"under {_gib(SHM_MIN_BYTES)} GiB: "
            "vLLM's shm broadcast and NCCL's shared-memory transport fail at TP > 1 "
            "(docker run --shm-size 16g or --ipc=host)",
        )
    return Check("shm", OK, f"/dev/shm {_gib(total)} GiB ({_gib(free)} GiB free)")


def _parse_cuda(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def vllm_build(vllm: VllmProbe, driver_cuda: tuple[int, int] | None) -> Check:
    """vLLM imports, and the CUDA its torch is built with is one the driver runs: a newer major
    version than the driver's fails; a newer minor one works under CUDA's minor version compatibility
    short of PTX JIT and newer features, so it is a warning."""
    if vllm.timed_out:
        return Check("vllm", WARN, f"not checked: {vllm.error}")
    if vllm.error is not None or not vllm.vllm_version:
        return Check("vllm", FAIL, f"vLLM does not import: {vllm.error or 'not installed'}")
    built = _parse_cuda(vllm.torch_cuda)
    head = f"vLLM {vllm.vllm_version}, torch {vllm.torch_version or '?'} built for CUDA {vllm.torch_cuda or 'none'}"
    if built is None:
        return Check("vllm", FAIL, f"{head}: not a CUDA build")
    if driver_cuda is None:
        return Check("vllm", WARN, f"{head}; the driver's CUDA version is unknown")
    if built[0] > driver_cuda[0]:
        return Check(
            "vllm",
            FAIL,
            f"{head}, newer than the driver's CUDA {_version(driver_cuda)}: "
            "update the driver or install a build for this CUDA",
        )
    if built > driver_cuda:
        return Check(
            "vllm",
            WARN,
            f"{head}, newer than the driver's CUDA {_version(driver_cuda)} (minor version "
            "compatibility: runs, short of PTX JIT and newer features)",
        )
    return Check("vllm", OK, f"{head}; driver CUDA {_version(driver_cuda)}")


@dataclass(frozen=True)
class Xid:
    xid: int
    where: str
    line: str = field(compare=False)


def xids_in(lines: Sequence[str]) -> list[Xid]:
    return [Xid(int(m.group("xid")), m.group("where"), line.strip()) for line in lines if (m := XID_LINE.search(line))]


def xid_errors(log: KernelLog) -> Check:
    if log.error is not None:
        return Check("xid", WARN, f"kernel log not readable ({log.error}): Xid errors not checked")
    found = xids_in(log.lines)
    if not found:
        return Check("xid", OK, "no Xid error in the kernel log")
    fatal = [x for x in found if x.xid in FATAL_XIDS]
    worst = fatal or found
    summary = ", ".join(sorted({f"Xid {x.xid} ({x.where})" for x in worst}))
    if fatal:
        return Check("xid", FAIL, f"GPU errors that need the node drained: {summary}; last: {fatal[-1].line}")
    return Check("xid", WARN, f"Xid errors in the kernel log (usually a program's fault): {summary}")


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f}"


def _version(v: tuple[int, int] | None) -> str:
    return "?" if v is None else f"{v[0]}.{v[1]}"
