"""One bug, one fingerprint, whatever Python the node runs: py-spy dumps of one host deadlock recorded
under a static and a shared-libpython 3.11 and a shared 3.12, with and without native frames, hash
alike; another deadlock, a CUDA event sync stall and a lost collective each hash otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from soakmatrix.jobs import culprit as cp
from soakmatrix.jobs.signatures import classify, clues_from_texts

from tests.incident_dumps import dump

PYSPY = Path(__file__).resolve().parent / "data" / "pyspy"
BUILDS = ("py311_static", "py311_shared", "py312_shared")


def recorded(name: str) -> str:
    return "\n".join(l for l in (PYSPY / name).read_text().splitlines() if not l.startswith("# "))


def hang(text: str):
    return classify(clues_from_texts([text], verdict_kind="hang"))


def deadlock(where: str) -> dict[str, object]:
    names = [f"host_deadlock_{where}_{build}_{kind}.txt" for build in BUILDS for kind in ("native", "plain")]
    if where == "schedule":
        names.append("host_deadlock_schedule_py312_static_symbolised.txt")
    return {name: hang(recorded(name)) for name in names}


@pytest.mark.parametrize("where", ["schedule", "update"])
def test_one_host_deadlock_has_one_fingerprint_under_every_python_build(where):
    results = deadlock(where)
    for name, r in results.items():
        assert r.signature == "silent_stall", (name, r.signature)
        assert r.culprit.startswith("EngineCore MainThread"), (name, r.culprit)
    assert len({r.fingerprint for r in results.values()}) == 1, {n: r.fingerprint for n, r in results.items()}


def test_the_static_builds_interpreter_frames_were_what_split_it():
    # what a static interpreter put in the culprit's frames, and what is hashed of them now
    text = recorded("host_deadlock_schedule_py311_static_native.txt")
    frames = [(f.function, f.location) for f in next(t for t in clues_from_texts([text]).stacks
                                                      if t.thread == "MainThread").frames]
    assert ("PyThread_acquire_lock_timed", "python3.11") in frames
    assert cp.normalised(frames) == ["host_deadlock:allocate_slots", "host_deadlock:schedule", "host_deadlock:main"]


def test_distinct_bugs_keep_distinct_fingerprints():
    prints = {
        "deadlock in schedule": hang(recorded("host_deadlock_schedule_py312_shared_native.txt")),
        "deadlock in update_from_output": hang(recorded("host_deadlock_update_py312_shared_native.txt")),
        "event sync stall": hang(dump("seed000_event_sync_stall.pyspy.txt")),
        "lost collective": hang(recorded("collective_wait_gloo_cpu_native.txt")),
    }
    assert len({r.fingerprint for r in prints.values()}) == 4, {k: r.fingerprint for k, r in prints.items()}
    assert prints["event sync stall"].signature == "event_sync_stall"
    collective = prints["lost collective"]
    assert collective.signature == "collective_stall"
    assert collective.culprit.startswith("Worker_TP1 MainThread: NCCL/gloo collective"), collective.culprit


@pytest.mark.parametrize("frame, internal", [
    (("PyThread_acquire_lock_timed", "python3.12"), True),
    (("_PyEval_EvalFrameDefault", "ceval.c:705"), True),
    (("take_gil", "libpython3.12.so.1.0"), True),
    (("method_vectorcall_VARARGS_KEYWORDS", "python3.12"), True),
    (("pthread_cond_wait", "libc-2.31.so"), True),
    (("__futex_abstimed_wait_common", "libc.so.6"), True),
    (("__new_sem_wait_slow64.constprop.0", "libc.so.6"), True),
    (("start_thread", "libpthread-2.31.so"), True),
    (("clone3", "libc.so.6"), True),
    (("std::condition_variable::wait", "libstdc++.so.6"), True),
    (("execute_native_thread_routine", "libstdc++.so.6"), True),
    (("0x7f0c3f4a3f16", "libc.so.6"), True),
    (("cuEventSynchronize", "libcuda.so.595.45.04"), False),
    (("cudaStreamSynchronize", "libcudart.so.12"), False),
    (("ncclProxyProgress", "libnccl.so.2"), False),
    (("c10::cuda::impl::CUDAGuardImpl::synchronizeEvent", "libc10_cuda.so"), False),
    (("gloo::allreduce", "libtorch_cpu.so"), False),
    (("Scheduler.schedule", "vllm/v1/core/sched/scheduler.py"), False),
    # a Python function is never taken for an interpreter one by its name
    (("Py_thing", "model.py"), False),
])
def test_runtime_internals_are_told_from_the_frames_that_name_a_bug(frame, internal):
    assert cp.runtime_internal(*frame) is internal
