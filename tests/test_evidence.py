"""Evidence capture: stacks of the whole tree, watchdog dumps, metrics, logs; bounded when py-spy hangs."""

import subprocess
import time
from pathlib import Path

import pytest

from fake_openai import start_fake
from soakmatrix.jobs import evidence
from soakmatrix.jobs.signatures import parse_stacks

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
    assert "gpu_state" in ev.artifacts or any("GPU state skipped" in n for n in ev.notes)


@pytest.mark.slow
def test_capture_of_a_dead_server_still_keeps_the_log(tmp_path):
    server, failure = start_fake(tmp_path)
    assert failure is None
    server.stop(grace_s=5)
    ev = evidence.capture(server, tmp_path / "evidence")
    assert "py_spy" not in ev.artifacts and ev.log_tail
    assert any("/metrics snapshot failed" in n for n in ev.notes)
