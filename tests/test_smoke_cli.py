"""`soakmatrix smoke` through the real CLI: changed files -> cells, budget, informative order, --fail-fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import EXAMPLES, REPO

from soakmatrix.matrix.contracts.outcomes import Outcome

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]


def smoke_matrix(folder: Path) -> Path:
    """The demo matrix with a pairwise smoke profile and source dependencies."""
    text = (EXAMPLES / "demo.yaml").read_text()
    text = text.replace("hang_model: hangs/demo.yaml", f"hang_model: {EXAMPLES / 'hangs' / 'demo.yaml'}")
    text = text.replace("profiles:\n", "profiles:\n  smoke:\n    coverage: {t: 2}\n    soak: 45m\n    startup: 5s\n"
                                       "    workloads: [staggered]\n    budget_gpu_hours: 10\n", 1)
    text += ('source_dependencies:\n  "vllm/v1/spec_decode/**": [mtp]\n'
             '  "vllm/v1/core/sched/**": [async_scheduling]\n')
    path = folder / "smoke-demo.yaml"
    path.write_text(text)
    return path


def run_cli(*args: str, stdin: str | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=dict(os.environ))


def test_changed_files_touching_no_flag_soak_nothing(tmp_path):
    matrix = smoke_matrix(tmp_path)
    changed = tmp_path / "changed.txt"
    changed.write_text("docs/index.md\nREADME.md\n")
    result = run_cli("smoke", str(matrix), "--changed-files", str(changed), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "nothing to soak" in result.stderr
    assert not (tmp_path / "out").exists()


def test_changed_files_from_stdin_name_the_flags_they_touch(tmp_path):
    matrix = smoke_matrix(tmp_path)
    result = run_cli("smoke", str(matrix), "--changed-files", "-", "--budget", "0.0001",
                     "--out", str(tmp_path / "out"), stdin="vllm/v1/spec_decode/eagle.py\n")
    assert "mtp <- vllm/v1/spec_decode/eagle.py" in result.stderr
    assert "no cell fits the budget" in result.stderr and result.returncode == 0


def test_bad_budget_and_missing_changed_files_are_usage_errors(tmp_path):
    matrix = smoke_matrix(tmp_path)
    assert run_cli("smoke", str(matrix), "--budget", "-1").returncode == 2
    missing = run_cli("smoke", str(matrix), "--changed-files", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "nope.txt" in missing.stderr


@pytest.mark.slow
def test_smoke_runs_touched_cells_most_informative_first_and_fails_fast(tmp_path):
    from soakmatrix.reports.history import HistoryStore

    matrix = smoke_matrix(tmp_path)
    out = tmp_path / "out"
    changed = tmp_path / "changed.txt"
    changed.write_text("vllm/v1/spec_decode/mtp_proposer.py\n")
    result = run_cli("smoke", str(matrix), "--changed-files", str(changed), "--budget", "2",
                     "--fail-fast", "--out", str(out))
    assert result.returncode == 1, result.stderr           # the MTP x cudagraph hang
    assert "running 2 of 3 cells" in result.stderr          # the budget dropped the least informative
    with HistoryStore(out / "history.sqlite") as store:
        run = store.runs()[-1]
        planned = store.planned_cell_ids(run.id)
        results = store.results(run.id)
    assert run.kind == "smoke" and run.status == "stopped" and len(planned) == 2
    hangs = [r for r in results if r.outcome is Outcome.HANG]
    assert hangs and all(r.flags["mtp"] == 1 for r in results)
    # fail-fast: the first hang cancelled the other, still soaking cell
    assert len(results) == 1 and "cancelled before a verdict" in result.stderr
    assert (out / "junit.xml").is_file()
    # the CLI ran the cells in the informative order, cut by the budget
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.smoke_selection import cells_touching, informative_order
    from soakmatrix.matrix.spec import load_matrix
    m = load_matrix(matrix)
    expected = informative_order(cells_touching(plan(m, "smoke").cells, {"mtp"}, m.baseline), 2, m.baseline, {"mtp"})
    assert planned == [pc.id for pc in expected[:2]]
    from tests.test_run_cli import assert_gone
    assert_gone(str(out))
