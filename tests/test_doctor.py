"""The node preflight: every check's ok, warn and fail from faked probes, which checks a backend gets,
the probes' readers with fake systems, and the real `soakmatrix doctor` on this machine (no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from soakmatrix.jobs import doctor
from soakmatrix.jobs.doctor import checks as c
from soakmatrix.jobs.doctor import probes as p

GiB = 2**30
H200 = c.GpuExpectation("H200", "H200", 2)
RTX = c.GpuExpectation("RTX5090", "GeForce-RTX-5090", 1)


def gpus(*names, used=GiB // 2, procs=()):
    return tuple(c.GpuInfo(i, n, used, 141 * GiB, procs) for i, n in enumerate(names))


def nvml(*names, **kw):
    return c.NvmlProbe(gpus(*names, **kw), (12, 8), "570.86.15")


def test_nvml_readable():
    assert c.nvml_readable(nvml("NVIDIA H200")).status == c.OK
    no_lib = c.nvml_readable(c.NvmlProbe(error="NVMLError_LibraryNotFound: NVML Shared Library Not Found"))
    assert no_lib == c.Check("nvml", c.FAIL, "no GPU on this node: NVML is not readable "
                                             "(NVMLError_LibraryNotFound: NVML Shared Library Not Found)")
    assert c.nvml_readable(c.NvmlProbe()).detail == "no GPU on this node: NVML answers but lists no GPU"


@pytest.mark.parametrize("nvml_name, expected, match", [
    ("NVIDIA H200", H200, True), ("NVIDIA H200 NVL", H200, True), ("NVIDIA H20", H200, False),
    ("NVIDIA GeForce RTX 5090", RTX, True), ("NVIDIA GeForce RTX 4090", RTX, False),
])
def test_nvml_names_are_matched_to_the_matrixs_type(nvml_name, expected, match):
    assert c.gpu_type_matches(nvml_name, expected) is match


def test_gpu_type():
    assert c.gpu_type(nvml("NVIDIA H200", "NVIDIA H200"), H200).status == c.OK
    assert c.gpu_type(nvml("NVIDIA H200"), None).status == c.OK
    mixed = c.gpu_type(nvml("NVIDIA H200", "NVIDIA H20"), None)
    assert mixed.status == c.WARN and "mixed types" in mixed.detail
    wrong = c.gpu_type(nvml("NVIDIA H20", "NVIDIA H20"), H200)
    assert wrong == c.Check("gpu_type", c.FAIL, "the matrix's H200 (ray_label H200) is none of this node's GPUs: "
                                                "NVIDIA H20")
    assert c.gpu_type(nvml("NVIDIA H200"), H200).detail == "1 H200 GPU(s) here, the matrix says 2 per node"


def test_gpus_free():
    assert c.gpus_free(nvml("NVIDIA H200")).status == c.OK
    busy = c.gpus_free(nvml("NVIDIA H200", procs=((4242, 30 * GiB),)))
    assert busy == c.Check("gpus_free", c.FAIL, "foreign processes on the GPUs: GPU0 pid 4242 (30.0 GiB)")
    assert c.gpus_free(nvml("NVIDIA H200", procs=((7, GiB),)), own_pids=[7]).status == c.OK
    held = c.gpus_free(nvml("NVIDIA H200", used=40 * GiB))
    assert held.status == c.FAIL and "GPU0 40.0 GiB" in held.detail


@pytest.mark.parametrize("scope, cap, status", [
    (None, 0, c.OK), (0, 0, c.OK), (1, 1 << c.CAP_SYS_PTRACE, c.OK), (2, (1 << c.CAP_SYS_PTRACE) | 1, c.OK),
    (1, 0xa80425fb, c.WARN),      # Docker's default set: no CAP_SYS_PTRACE
    (3, 1 << c.CAP_SYS_PTRACE, c.WARN),
])
def test_ptrace_allowed(scope, cap, status):
    check = c.ptrace_allowed(scope, cap)
    assert check.status == status, check
    if status == c.WARN and scope == 1:
        assert "--cap-add SYS_PTRACE" in check.detail


def test_shm_size():
    assert c.shm_size(16 * GiB, 15 * GiB).status == c.OK
    docker_default = c.shm_size(64 * 2**20, 64 * 2**20)
    assert docker_default.status == c.FAIL and "under 1.0 GiB" in docker_default.detail
    assert c.shm_size(16 * GiB, GiB // 4).status == c.FAIL     # big enough, but full
    assert c.shm_size(None, None, "/dev/shm: No such file or directory").status == c.FAIL


@pytest.mark.parametrize("torch_cuda, driver, status", [
    ("12.8", (12, 8), c.OK), ("12.4", (12, 8), c.OK), ("12.8", (12, 4), c.WARN), ("13.0", (12, 8), c.FAIL),
    (None, (12, 8), c.FAIL), ("12.8", None, c.WARN),
])
def test_vllm_build(torch_cuda, driver, status):
    probe = c.VllmProbe("0.11.0", "2.8.0", torch_cuda)
    assert c.vllm_build(probe, driver).status == status


def test_vllm_whose_import_did_not_finish_is_a_warning_not_a_refusal():
    slow = c.VllmProbe(error="importing vLLM took more than 180 s", timed_out=True)
    assert c.vllm_build(slow, (12, 8)) == c.Check("vllm", c.WARN, "not checked: importing vLLM took more than 180 s")
    report = doctor.diagnose(probes(nvml=c.NvmlProbe(error="NVMLError_LibraryNotFound"), vllm=slow), "vllm", "cpu")
    assert report.ok and [x.status for x in report.checks] == ["ok", "ok", "warn"]


def test_vllm_that_does_not_import_fails():
    check = c.vllm_build(c.VllmProbe(error="ModuleNotFoundError: No module named 'vllm'"), (12, 8))
    assert check == c.Check("vllm", c.FAIL, "vLLM does not import: ModuleNotFoundError: No module named 'vllm'")


def test_xid_errors():
    assert c.xid_errors(c.KernelLog(("[ 1.0] usb 1-1: new device",))).status == c.OK
    app = c.xid_errors(c.KernelLog(("[9.1] NVRM: Xid (PCI:0000:3b:00): 13, pid=812, Graphics Exception",)))
    assert app.status == c.WARN and "Xid 13 (PCI:0000:3b:00)" in app.detail
    lost = c.xid_errors(c.KernelLog((
        "[9.1] NVRM: Xid (PCI:0000:3b:00): 13, pid=812, Graphics Exception",
        "[9.2] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', GPU has fallen off the bus.")))
    assert lost.status == c.FAIL and lost.detail.startswith("GPU errors that need the node drained: Xid 79")
    denied = c.xid_errors(c.KernelLog(error="dmesg: read kernel buffer failed: Operation not permitted"))
    assert denied.status == c.WARN and "not checked" in denied.detail


def probes(**kw):
    base = dict(nvml=nvml("NVIDIA H200", "NVIDIA H200"), ptrace_scope=0, cap_eff=0,
                shm=p.ShmProbe(64 * GiB, 64 * GiB), vllm=c.VllmProbe("0.11.0", "2.8.0", "12.8"),
                kernel_log=c.KernelLog(()))
    base.update(kw)
    return doctor.Probes(**base)


def test_a_fit_gpu_node_passes_every_check():
    report = doctor.diagnose(probes(), "vllm", "gpu-1", H200)
    assert [x.name for x in report.checks] == ["nvml", "gpu_type", "gpus_free", "ptrace", "shm", "vllm", "xid"]
    assert report.ok and report.summary() == "node gpu-1 preflight ok"
    assert doctor.DoctorReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_a_node_without_a_gpu_says_so_first_and_skips_what_needs_one():
    report = doctor.diagnose(probes(nvml=c.NvmlProbe(error="NVMLError_LibraryNotFound")), "vllm", "cpu-1", H200)
    assert [x.name for x in report.checks] == ["nvml", "ptrace", "shm", "vllm", "xid"]
    assert not report.ok and report.summary().startswith("node cpu-1 failed its preflight: nvml: no GPU on this node")
    assert report.text().splitlines()[1].split() == ["FAIL", "nvml", "no", "GPU", "on", "this", "node:", "NVML",
                                                     "is", "not", "readable", "(NVMLError_LibraryNotFound)"]


def test_vllms_cpu_build_on_a_machine_without_gpus_is_not_refused_for_lacking_one():
    # the real engine's CPU build (the project's own end-to-end tests, `make demo-vllm`)
    cpu = probes(nvml=c.NvmlProbe(error="NVMLError_LibraryNotFound"), vllm=c.VllmProbe("0.11.0", "2.8.0+cpu", None))
    report = doctor.diagnose(cpu, "vllm", "cpu-1", c.GpuExpectation("cpu", "cpu", 1))
    assert [x.name for x in report.checks] == ["ptrace", "shm", "vllm"] and report.ok
    assert report.notes == ("no GPU on this node: vLLM's CPU build runs on the CPU, GPU checks not run",)
    # a CPU build on a GPU node, or no vLLM at all on a CPU machine, is still refused
    on_gpus = doctor.diagnose(probes(vllm=c.VllmProbe("0.11.0", "2.8.0+cpu", None)), "vllm", "gpu-1", H200)
    assert [x.name for x in on_gpus.failed] == ["vllm"]
    missing = probes(nvml=c.NvmlProbe(error="NVMLError_LibraryNotFound"), vllm=c.VllmProbe(error="No module"))
    assert [x.name for x in doctor.diagnose(missing, "vllm", "cpu-1").failed] == ["nvml", "vllm"]


def test_the_simulated_backend_is_checked_for_ptrace_alone():
    # fake GPU types, no GPU, no vLLM: none of it may fail a sim cell
    report = doctor.diagnose(probes(nvml=c.NvmlProbe(error="none"), vllm=None), "sim", "cpu-1", H200)
    assert [x.name for x in report.checks] == ["ptrace"] and report.ok
    assert report.notes == ("GPU checks not run: the sim backend uses no GPU",)


def test_the_readers_turn_a_system_into_probes(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapEff:\t00000000a80425fb\n")
    assert p.read_cap_eff(str(status)) == 0xa80425fb and p.read_cap_eff(str(tmp_path / "none")) is None
    (tmp_path / "scope").write_text("1\n")
    assert p.read_ptrace_scope(str(tmp_path / "scope")) == 1 and p.read_ptrace_scope(str(tmp_path / "x")) is None
    assert p.read_shm(str(tmp_path)).total > 0 and p.read_shm(str(tmp_path / "x")).total is None
    refusal = "dmesg: read kernel buffer failed: Operation not permitted"
    denied = SimpleNamespace(returncode=1, stdout="", stderr=refusal + "\n")
    assert p.read_kernel_log(lambda *a, **k: denied).error == refusal
    crashed = SimpleNamespace(returncode=-11, stdout="", stderr="Segmentation fault\n")
    assert p.read_vllm(run=lambda *a, **k: crashed).error == "the import crashed: Segmentation fault"
    # the probe's child, for real: the run's cheap form finds vLLM without importing it
    found = p.read_vllm(full_import=False)
    assert found.vllm_version or found.error in ("ModuleNotFoundError: No module named 'vllm'",
                                                 "ModuleNotFoundError: No module named 'torch'")

    class FakeNvml:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetCount(self): return 1
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=GiB, total=141 * GiB)
        def nvmlDeviceGetName(self, h): return b"NVIDIA H200"
        def nvmlDeviceGetComputeRunningProcesses(self, h): return [SimpleNamespace(pid=9, usedGpuMemory=GiB)]
        def nvmlSystemGetCudaDriverVersion(self): return 12080
        def nvmlSystemGetDriverVersion(self): return "570.86.15"

    assert p.read_nvml(FakeNvml()) == c.NvmlProbe((c.GpuInfo(0, "NVIDIA H200", GiB, 141 * GiB, ((9, GiB),)),),
                                                  (12, 8), "570.86.15")


def doctor_cli(*args):
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "doctor", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_real_doctor_on_this_machine():
    """No GPU here (CI, a developer's machine): it says so, and exits 3 unless vLLM's CPU build is
    what runs here; on a GPU node its exit code follows its checks."""
    done = doctor_cli("--json")
    report = json.loads(done.stdout)
    checks = {x["name"]: x for x in report["checks"]}
    assert done.returncode == (0 if report["ok"] else 3)
    if "nvml" not in checks:
        assert report["notes"] == ["no GPU on this node: vLLM's CPU build runs on the CPU, GPU checks not run"]
    elif checks["nvml"]["status"] == "fail":
        assert report["checks"][0]["detail"].startswith("no GPU on this node") and done.returncode == 3
    else:
        assert "gpu_type" in checks and "gpus_free" in checks
    sim = doctor_cli("--backend", "sim")
    assert sim.stdout.splitlines()[-1].startswith("ok") and sim.returncode == 0
    usage = doctor_cli("--gpu", "H200")
    assert usage.returncode == 2 and "--gpu needs --matrix" in usage.stderr
