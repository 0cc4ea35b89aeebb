"""The log detector on real excerpts (fixtures/incidents) and typical error lines."""

from pathlib import Path

import pytest

from soakmatrix.jobs.detect.logs import LogDetector
from soakmatrix.jobs.detect.protocol import MetricsSample, Tick, StreamState

INCIDENTS = Path(__file__).resolve().parent.parent / "fixtures" / "incidents"
LOADED = StreamState(at=0, open_streams=3)
IDLE = StreamState(at=0, open_streams=0)


def observe(lines, stream=LOADED, metrics=None):
    return LogDetector().observe(Tick(now=1.0, log_lines=lines, stream=stream, metrics=metrics))


@pytest.mark.parametrize("name", ["seed002_shm_broadcast_timeout.log", "seed003_shm_broadcast_timeout.log",
                                  "seed004_shm_broadcast_timeout.log"])
def test_seed_logs_are_hangs_pointing_at_shm_broadcast(name):
    lines = [l for l in (INCIDENTS / name).read_text().splitlines() if not l.startswith("# ")]
    v = observe(lines)
    assert v is not None and v.kind == "hang" and v.hint == "shm_broadcast_timeout"


def test_shm_warning_while_idle_is_not_a_finding_but_the_rpc_timeout_is():
    warn = "(EngineCore pid=7) INFO 11-21 00:08:22 [shm_broadcast.py:681] No available shared memory broadcast block found in 60 seconds."
    assert observe([warn], stream=IDLE) is None
    assert observe([warn], stream=IDLE, metrics=MetricsSample(at=0, running=1)) is not None
    v = observe([warn, "TimeoutError: RPC call to sample_tokens timed out."], stream=IDLE)
    assert v is not None and "RPC call to sample_tokens timed out" in v.message


@pytest.mark.parametrize("line,kind,hint", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "crash", "oom"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "crash", "cuda_error"),
    ("[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)",
     "hang", "nccl_timeout"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
     "for the root cause.", "crash", "engine_dead"),
])
def test_error_lines(line, kind, hint):
    v = observe(["INFO all good", line])
    assert v is not None and (v.kind, v.hint) == (kind, hint)


def test_ordinary_lines_are_quiet():
    lines = ["(APIServer pid=1) INFO 11-21 12:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: "
             "10.0 tokens/s, Avg generation throughput: 200.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs",
             "INFO:     127.0.0.1:5000 - \"POST /v1/completions HTTP/1.1\" 200 OK"]
    assert observe(lines) is None
