"""A run's node preflight without Ray: what a cell's node must have, the run's cache, when a cell is
refused and what its result then says, and that simulated cells are never refused."""

from __future__ import annotations

import time
from types import SimpleNamespace

from soakmatrix.jobs import doctor
from soakmatrix.jobs.doctor import checks as c
from soakmatrix.jobs.doctor import probes as p
from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.workloads import Workload
from soakmatrix.matrix.schedule import preflight
from soakmatrix.matrix.schedule.task import checked_node


def spec(backend="vllm", **kw) -> SoakSpec:
    base = dict(cell_id="c1", cell_name="m|H200|tp=2|w", model="m", model_path="m", gpu_type="H200", gpu_count=2,
                workload=Workload("w", "random", {}), flags={"tp": 2}, serve_args=(), backend=backend,
                artifacts_dir="/tmp/x")
    base.update(kw)
    return SoakSpec(**base)


def report(*statuses: str, node="gpu-7") -> dict:
    return {"node": node, "backend": "vllm", "ok": "fail" not in statuses, "notes": [],
            "checks": [{"name": f"check{i}", "status": s, "detail": f"detail {i}"} for i, s in enumerate(statuses)]}


def test_a_gpu_cell_asks_for_its_type_and_count_a_simulated_one_for_none():
    assert preflight.expectation_for(spec(), "H200") == c.GpuExpectation("H200", "H200", 2)
    assert preflight.expectation_for(spec(gpu_type="RTX5090"), "GeForce-RTX-5090").ray_label == "GeForce-RTX-5090"
    assert preflight.expectation_for(spec("sim"), "H200") is None


def test_a_node_is_diagnosed_once_then_read_from_the_runs_cache():
    calls = []

    def diagnose(backend, expected, indices):
        calls.append((backend, expected, indices))
        return report("ok")

    first, new = preflight.node_report(spec(), "H200", None, diagnose, gpu_ids=["3", "4"])
    assert new and calls == [("vllm", c.GpuExpectation("H200", "H200", 2), [3, 4])]
    again, new = preflight.node_report(spec(), "H200", first, diagnose)
    assert again == first and not new and len(calls) == 1
    assert preflight.gpu_indices([]) is None and preflight.gpu_indices(["GPU-uuid"]) is None
    assert preflight.cache_key("n1", spec()) != preflight.cache_key("n1", spec("sim"))
    assert preflight.cache_key("n1", spec(build="nightly")) == "n1|vllm|H200|nightly"


def test_a_failed_node_refuses_the_cell_as_an_infra_error_with_the_doctors_detail():
    assert preflight.refusal(spec(), report("ok", "warn")) is None
    refused = preflight.refusal(spec(), report("ok", "fail", "fail"))
    assert refused.outcome is Outcome.INFRA_ERROR and refused.outcome.retryable
    assert refused.message == ("node gpu-7 failed its preflight (soakmatrix doctor): check1: detail 1; "
                               "check2: detail 2")
    assert refused.node == "gpu-7" and refused.preflight["checks"][1]["status"] == "fail"


def test_simulated_cells_are_never_refused_on_a_node_without_a_gpu():
    probes = doctor.Probes(nvml=c.NvmlProbe(error="NVMLError_LibraryNotFound"), ptrace_scope=3, cap_eff=0,
                           shm=p.ShmProbe(None, None, "absent"), vllm=None, kernel_log=c.KernelLog(error="denied"))

    def diagnose(backend, expected, indices):
        return doctor.diagnose(probes, backend, "cpu-1", expected, gpu_indices=indices).to_dict()

    sim_report, _ = preflight.node_report(spec("sim", gpu_type="fake-gpu"), "fake-gpu", None, diagnose)
    assert preflight.refusal(spec("sim"), sim_report) is None
    gpu_report, _ = preflight.node_report(spec(), "H200", None, diagnose)
    assert "no GPU on this node" in preflight.refusal(spec(), gpu_report).message


def test_the_free_gpu_check_looks_at_the_cells_gpus_only():
    busy = c.NvmlProbe(tuple(c.GpuInfo(i, "NVIDIA H200", 0, 141 << 30, ((100 + i, 1 << 30),) if i < 2 else ())
                             for i in range(4)), (12, 8))
    assert c.gpus_free(busy, indices=[2, 3]).status == c.OK
    assert c.gpus_free(busy, indices=[1, 2]).detail == "foreign processes on the GPUs: GPU1 pid 101 (1.0 GiB)"


class FakeMailbox:
    """The run's mailbox as a task sees it, without Ray: its `preflight` answers the key's cached report."""

    def __init__(self, cached=None):
        self.remembered = []
        self.preflight = SimpleNamespace(remote=lambda key: (cached or {}).get(key))
        self.remember_preflight = SimpleNamespace(remote=lambda key, rep: self.remembered.append((key, rep)))


def test_a_doctor_that_stalls_or_breaks_refuses_the_cell_and_never_hangs_it():
    mailbox = FakeMailbox()
    started = time.monotonic()
    rep, refused = checked_node(spec(), "H200", "n1", mailbox, lambda *a: time.sleep(30), [], timeout_s=1, get=get)
    assert time.monotonic() - started < 5
    assert refused.message == ("node n1 failed its preflight (soakmatrix doctor): doctor: the preflight did not "
                               "finish in 1 s")
    assert not mailbox.remembered

    def broken(*a):
        raise RuntimeError("NVML stuck")

    _, refused = checked_node(spec(), "H200", "n1", mailbox, broken, [], timeout_s=5, get=get)
    assert refused.message.endswith("doctor: the preflight failed: RuntimeError: NVML stuck")
    rep, refused = checked_node(spec(), "H200", "n1", mailbox, lambda *a: report("ok"), [], timeout_s=5, get=get)
    assert refused is None and mailbox.remembered == [("n1|vllm|H200", rep)]
    # the next cell on the node reads the run's report: no doctor, and a failed one refuses it too
    cached = FakeMailbox({"n1|vllm|H200": report("fail")})
    rep, refused = checked_node(spec(), "H200", "n1", cached, broken, [], get=get)
    assert rep == report("fail") and refused.message.endswith("check0: detail 0") and not cached.remembered


def get(value, timeout):
    return value
