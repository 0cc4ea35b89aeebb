"""The bisection driver replayed from a real run: the probe answers the real engine gave to the
three-flag bisection of fixtures/vllm_cpu_bisect_ci.yaml (a planted pair, an innocent flag), recorded
by `make record-cassettes` (tests/record_cassettes.py), fed back through `soakmatrix bisect --resume`.

Every probe is answered from the recorded journal, so no cluster and no server starts: the CLI, the
journal's replay and the whole bisection (calibration, ablation, the search, certification, the
verdicts) run as in the real run and must give the answer it gave, byte for byte but for the matrix's
path. A change that makes the bisection ask other questions fails here with the journal line where
it parted; record the cassette again if the change is deliberate.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.record_cassettes import CASSETTES, command

CASSETTE = CASSETTES / "vllm_cpu_bisect_ci"

pytestmark = pytest.mark.slow   # the CLI as a subprocess (seconds: no cluster, no server)


def replay(tmp_path, cli: list[str]) -> subprocess.CompletedProcess:
    out = tmp_path / "bisect-out"
    out.mkdir()
    shutil.copyfile(CASSETTE / "journal-flags.jsonl", out / "journal-flags.jsonl")
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *cli, "--out", str(out), "--resume"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_the_recorded_real_bisection_replays_to_the_answer_it_gave(tmp_path):
    cli = json.loads((CASSETTE / "command.json").read_text())
    assert cli == command(), "the cassette was recorded with other options: `make record-cassettes`"
    run = replay(tmp_path, cli)
    assert run.returncode == 1, run.stderr[-3000:]      # 1: a minimal set was found
    assert "resuming from" in run.stderr, run.stderr[-3000:]
    assert "soakmatrix bisect: on " not in run.stderr, run.stderr[-3000:]   # every probe answered: no cluster
    doc = json.loads(run.stdout[run.stdout.find("{"):])
    recorded = json.loads((CASSETTE / "answer.json").read_text())
    assert {k: v for k, v in doc.items() if k != "matrix"} == {k: v for k, v in recorded.items() if k != "matrix"}
    assert doc["status"] == "found" and doc["minimal"] == ["chunked_prefill", "prefix_caching"]
    assert {v["flag"]: v["kind"] for v in doc["verdicts"]} == {
        "chunked_prefill": "necessary", "prefix_caching": "necessary", "max_num_seqs": "unmeasured"}
    assert doc["posterior"] >= doc["confidence"] == 0.95


@pytest.mark.parametrize("changed", [["--confidence", "0.9"], ["--calibration-hangs", "3"]])
def test_a_replay_that_asks_other_questions_is_refused_with_the_line(tmp_path, changed):
    cli = json.loads((CASSETTE / "command.json").read_text())
    at = cli.index(changed[0])
    run = replay(tmp_path, [*cli[:at], *changed, *cli[at + 2:]])
    assert run.returncode == 2, run.stderr[-3000:]
    assert "journal-flags.jsonl:1:" in run.stderr and changed[0].lstrip("-").replace("-", "_") in run.stderr
