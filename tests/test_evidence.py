"""Evidence capture: stacks of the whole tree, watchdog dumps, metrics, logs; bounded when py-spy hangs."""

import subprocess
import time
from pathlib import Path

import pytest
from tests.fake_openai import start_fake

from soakmatrix.jobs import evidence
from soakmatrix.jobs.stacks import parse_stacks

SCHED_LOG = """INFO ok
ERROR 11-21 [dump_input.py:69] Dumping input data for V1 LLM engine (v0.33.0) with config: model='m'
ERROR 11-21 [dump_input.py:76] Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[])
ERROR 11-21 [dump_input.py:79] Dumping scheduler stats: SchedulerStats(num_running_reqs=2)
ERROR 11-21 [core.py:866] EngineCore encountered a fatal error.
"""


def test_scheduler_dump_lines_are_picked_out():
    lines = evidence.scheduler_dump_lines(SCHED_LOG.splitlines(), context=3)
    assert lines[0].startswith("ERROR 11-21 [dump_input.py:69]") and any("SchedulerStats(" in l for l in lines)
    assert "INFO ok" not in lines


def test_a_failing_py_spy_is_retried_without_native_and_reported():
    calls = []

    def failing(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "Error: Failed to suspend process")
    text, problem = evidence.pyspy_dump(1, runner=failing)
    assert text == "" and "Failed to suspend process" in problem
    assert "--native" in calls[0] and "--native" not in calls[1]


def test_a_hung_py_spy_is_cut_off():
    def hanging(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])
    text, problem = evidence.pyspy_dump(1, timeout_s=0.1, runner=hanging)
    assert text == "" and "timed out" in problem


@pytest.mark.slow
def test_capture_dumps_every_process_of_the_tree_and_keeps_the_rest(tmp_path):
    server, failure = start_fake(tmp_path, "--child")
    try:
        assert failure is None
        (tmp_path / "VLLM_STACK_DUMP_for_EngineCore_123.log").write_text(
            'Thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 7102 in _to_list\n')
        with open(server.log_path, "a") as f:
            f.write(SCHED_LOG)
        t0 = time.monotonic()
        ev = evidence.capture(server, tmp_path / "evidence", pyspy_timeout_s=30)
        assert time.monotonic() - t0 < 90
    finally:
        server.stop(grace_s=5)
    pids = {t.process.split(":")[0] for text in ev.stack_texts for t in parse_stacks(text) if t.process}
    assert str(server.pid) in pids and len(pids) == 2, ev.notes      # the server and its child
    assert Path(ev.artifacts["py_spy"]).read_text().count("Process ") == 2
    assert "VLLM_STACK_DUMP_for_EngineCore_123.log" in ev.artifacts, ev.notes
    assert any(t.frames and t.frames[0].function == "_to_list" for text in ev.stack_texts
               for t in parse_stacks(text))
    assert "vllm:generation_tokens_total" in Path(ev.artifacts["metrics"]).read_text(), ev.notes
    assert "SchedulerOutput(" in Path(ev.artifacts["scheduler_dump"]).read_text()
    assert ev.log_tail and ev.log_tail[-1].startswith("ERROR 11-21 [core.py:866]")
    # no GPU here: skipped with a note, not an error
    assert "gpu_state" in ev.artifacts and any("no GPU: not measured" in n for n in ev.notes), ev.notes


@pytest.mark.slow
def test_capture_of_a_dead_server_still_keeps_the_log(tmp_path):
    server, failure = start_fake(tmp_path)
    assert failure is None
    server.stop(grace_s=5)
    ev = evidence.capture(server, tmp_path / "evidence")
    assert "py_spy" not in ev.artifacts and ev.log_tail
    assert any("/metrics snapshot failed" in n for n in ev.notes)


class _Server:
    """The least `capture` reads: a pid, a base URL, a log."""

    def __init__(self, pid, folder):
        self.pid, self.base_url, self.log_path = pid, "http://127.0.0.1:9", folder / "server.log"
        self.log_path.write_text("INFO ok\n")

    def log_text(self, *a):
        return self.log_path.read_text()


def test_no_ptrace_permission_is_said_with_what_to_grant_and_gpu_state_is_kept(tmp_path):
    from soakmatrix.jobs.gpu_state import GpuState
    proc = subprocess.Popen(["sleep", "30"])
    try:
        denied = lambda pid, timeout: ("", f"py-spy exit 1 on pid {pid}: Error: Operation not permitted (os error 1)")
        ev = evidence.capture(_Server(proc.pid, tmp_path), tmp_path / "ev", pyspy=denied,
                              scrape=lambda url, t: "", gpu=lambda pids: GpuState(False, note="no GPU: not measured"))
    finally:
        proc.kill()
        proc.wait()
    assert ev.stacks_unreachable and ev.notes[0] == ev.stacks_unreachable
    assert "ptrace not permitted" in ev.notes[0] and "SYS_PTRACE" in ev.notes[0] and "ptrace_scope" in ev.notes[0]
    assert "py_spy" not in ev.artifacts and "gpu_state" in ev.artifacts
    assert '"state": null' in Path(ev.artifacts["gpu_state"]).read_text()


def test_other_py_spy_failures_are_not_called_ptrace():
    assert evidence.ptrace_problem(["py-spy timed out after 20 s on pid 4"]) is None
    assert "(now " in evidence.ptrace_problem(["Permission denied (os error 13)"], scope_file="/nonexistent")


def no_gpu(pids):
    from soakmatrix.jobs.gpu_state import GpuState
    return GpuState(False, note="no GPU: not measured")


def _tree_of_three():
    """A parent with two children (the shape of an API server, its engine core and a worker)."""
    return subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"])


def test_every_process_is_dumped_at_once_and_the_dumps_keep_the_trees_order(tmp_path):
    # an engine that dies soon after its hang (vLLM's RPC timeout after an shm hang) must be dumped
    # while it lives: one slow dump after another would reach it last. Each dump here waits until all
    # three are under way, so dumps taken one after another break the barrier (no clock to race: a
    # loaded machine once started the third 0.73 s after the first)
    import threading
    from soakmatrix.jobs.teardown import tree
    proc = _tree_of_three()
    all_under_way = threading.Barrier(3, timeout=20)

    def waits_for_the_others(pid, timeout):
        try:
            all_under_way.wait()
        except threading.BrokenBarrierError:
            return "", f"dumped alone: pid {pid}"
        return f"Thread {pid} (idle): \"MainThread\"\n    wait (x.py:1)\n", None
    try:
        time.sleep(0.3)
        order = [p.pid for p in tree(proc.pid)]
        ev = evidence.capture(_Server(proc.pid, tmp_path), tmp_path / "ev", pyspy=waits_for_the_others,
                              scrape=lambda url, t: "", gpu=no_gpu)
    finally:
        proc.kill()
        proc.wait()
    assert len(order) == 3
    assert not [n for n in ev.notes if "dumped alone" in n], ev.notes
    assert [int(text.split()[1].rstrip(":")) for text in ev.stack_texts] == order


def test_a_dump_past_the_evidence_budget_is_left_out_with_a_note(tmp_path):
    proc = _tree_of_three()

    def stuck_on_children(pid, timeout):
        if pid != proc.pid:
            time.sleep(3)
        return "Thread 1 (idle): \"MainThread\"\n    wait (x.py:1)\n", None
    try:
        time.sleep(0.3)
        ev = evidence.capture(_Server(proc.pid, tmp_path), tmp_path / "ev", pyspy=stuck_on_children, budget_s=1.0,
                              scrape=lambda url, t: "", gpu=no_gpu)
    finally:
        proc.kill()
        proc.wait()
    assert len(ev.stack_texts) == 1 and f"Process {proc.pid}:" in ev.stack_texts[0]
    assert "evidence budget spent: some processes not dumped" in ev.notes
