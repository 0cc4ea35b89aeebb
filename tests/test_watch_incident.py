"""An incident: evidence (fake capture here), the soak's classification, a CellResult, the hook's environment."""

import time
from pathlib import Path

from soakmatrix.jobs.detect.protocol import HangVerdict
from soakmatrix.jobs.evidence import Evidence
from soakmatrix.jobs.watch.incident import PTRACE_HELP, IncidentOptions, handle, watch_cell
from soakmatrix.jobs.watch.target import Target

STACK = """Process 4242: VLLM::EngineCore
Thread 4242 (active): "MainThread"
    synchronize (torch/cuda/streams.py:224)
    _to_list (vllm/v1/worker/gpu_model_runner.py:5321)
    sample_tokens (vllm/v1/worker/gpu_model_runner.py:3300)
"""


def fake_capture(stacks=(STACK,), notes=()):
    def capture(subject, folder, **kw):
        ev = Evidence(Path(folder), stack_texts=list(stacks), notes=list(notes))
        ev.log_tail = subject.log_text().splitlines()[-kw["tail_lines"]:]
        ev.artifacts["server_log"] = str(subject.log_path)
        return ev
    return capture


def verdict():
    now = time.time()
    return HangVerdict(detector="passive_progress", kind="hang", at=now, since=now - 7, message="flat for 7 s")


def test_incident_classifies_like_the_soak_and_runs_the_hook(tmp_path):
    target = Target("http://127.0.0.1:9")
    opts = IncidentOptions(tmp_path / "out", on_hang='env | grep ^SOAKMATRIX_ > "$SOAKMATRIX_EVIDENCE_DIR/env.txt"')
    inc = handle(verdict(), target, ["INFO line 1", "INFO line 2"], opts, model="m", watch_started=time.time() - 60,
                 running=3, capture_fn=fake_capture())
    inc.hook.join(10)
    r = inc.result
    assert r.outcome.value == "hang" and r.signature == "event_sync_stall" and r.fingerprint
    assert r.cell_id == watch_cell(target, "m")[0] and r.cell_name == "m|-|watch|127.0.0.1:9"
    assert r.detected_after_s == 7.0 and r.artifacts["evidence_dir"] == str(inc.folder)
    assert (inc.folder / "log-tail.txt").read_text() == "INFO line 1\nINFO line 2\n"
    env = (inc.folder / "env.txt").read_text()
    assert f"SOAKMATRIX_EVIDENCE_DIR={inc.folder}" in env and "SOAKMATRIX_SIGNATURE=event_sync_stall" in env
    assert "hook exited 0" in (inc.folder / "on-hang.log").read_text()
    assert (inc.folder / "result.json").exists()


def test_ptrace_denied_says_so_and_keeps_what_can_be_read(tmp_path):
    import os
    target = Target("http://127.0.0.1:9", pid=os.getpid())
    inc = handle(verdict(), target, [], IncidentOptions(tmp_path), model="m", watch_started=time.time(),
                 capture_fn=fake_capture(stacks=(), notes=["py-spy exit 1 on pid 1: Permission Denied"]))
    assert PTRACE_HELP in inc.notes
    assert "SYS_PTRACE" in (inc.folder / "evidence-notes.txt").read_text()
    assert (inc.folder / "proc-snapshot.json").exists() and "proc_snapshot" in inc.result.artifacts
    assert inc.result.signature == "silent_stall"    # no stacks: the verdict alone


def test_no_process_found_is_a_note_not_an_error(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inc = handle(verdict(), Target(f"http://127.0.0.1:{port}"), [], IncidentOptions(tmp_path), model="",
                 watch_started=time.time(), capture_fn=fake_capture(stacks=()))
    assert any("no server process found" in n for n in inc.notes)


def test_the_incident_result_carries_the_culprit_threads_and_gpu_state_as_the_soaks_does(tmp_path):
    from soakmatrix.jobs.gpu_state import GpuState

    def capture(subject, folder, **kw):
        ev = fake_capture()(subject, folder, **kw)
        ev.gpu = GpuState(False, note="no GPU: not measured")
        return ev
    r = handle(verdict(), Target("http://127.0.0.1:9"), [], IncidentOptions(tmp_path), model="m",
               watch_started=time.time(), capture_fn=capture).result
    assert r.culprit == "EngineCore MainThread: CUDA/event sync"
    assert r.threads[0]["kind"] == "culprit" and r.threads[0]["frames"][1].startswith("_to_list")
    assert r.gpu_state["measured"] is False and "not measured" in r.gpu_state["note"]
