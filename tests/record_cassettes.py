"""Records the real-engine bisection that tests/test_bisect_cassette.py replays: `make record-cassettes`.

The three-flag bisection of fixtures/vllm_cpu_bisect_ci.yaml (a planted pair among an innocent flag)
runs for real, as a user runs it (`soakmatrix bisect --backend vllm` on a private Ray cluster offering
the `cpu` type, 7-9 `vllm serve` probes, 8-17 minutes on 2 cores). Its probe journal is the cassette:
every probe the bisection asked and the answer the real engine gave. Kept beside it: the command
(without --out) and the answer the CLI printed. Record again after a deliberate change of the
bisection's questions (the replay then says where the new code parts from the journal), and say so
in the commit.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO

CASSETTES = REPO / "tests" / "data" / "cassettes"
MATRIX = "fixtures/vllm_cpu_bisect_ci.yaml"
OPTIONS = ["--backend", "vllm", "--confidence", "0.95", "--mttf-cap", "15s", "--modifier-prior", "0",
           "--calibration-hangs", "2", "--max-probes", "16", "--no-shrink", "--no-modifiers", "--parallel", "1",
           "--json"]
RUN_TIMEOUT_S = 2400.0


def failing_cell(matrix: Path) -> str:
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    cells = plan(load_matrix(matrix)).cells
    assert len(cells) == 1, [pc.name for pc in cells]
    return cells[0].id


def command() -> list[str]:
    """The recorded bisection's CLI arguments, paths relative to the repository's root."""
    return ["bisect", MATRIX, "--cell", failing_cell(REPO / MATRIX), *OPTIONS]


def write_cassette(folder: Path, cli: list[str], journal: Path, answer: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(journal, folder / "journal-flags.jsonl")
    (folder / "command.json").write_text(json.dumps(cli, indent=1) + "\n")
    (folder / "answer.json").write_text(json.dumps(answer, indent=1, sort_keys=True) + "\n")


def record(folder: Path = CASSETTES / "vllm_cpu_bisect_ci") -> dict:
    from tests.vllm_cpu_runs import run_cli_on_cpu_ray

    cli = command()
    with tempfile.TemporaryDirectory(prefix="soakmatrix-cassette-") as tmp:
        out = Path(tmp) / "bisect-out"
        code, stdout, stderr, wall = run_cli_on_cpu_ray([*cli, "--out", str(out)], RUN_TIMEOUT_S, "bisect")
        if code != 1:
            raise SystemExit(f"the real bisection did not find a set (exit {code}):\n{stderr[-3000:]}")
        answer = json.loads(stdout[stdout.find("{"):])
        write_cassette(folder, cli, out / "journal-flags.jsonl", answer)
    print(f"recorded {answer['probes']} probes in {wall:.0f} s: {answer['status']} {answer['minimal']} -> {folder}")
    return answer


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else CASSETTES / "vllm_cpu_bisect_ci")
