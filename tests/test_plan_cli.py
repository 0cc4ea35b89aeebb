"""`soakmatrix plan` through the real CLI: text, JSON for scripts, and exit code 2 on bad input."""

import json
import os
import subprocess
import sys

import pytest

from soakmatrix.matrix.cli import main

pytestmark = pytest.mark.slow   # every test runs `soakmatrix plan` as a subprocess


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_plan_json_is_stable_and_complete(examples):
    code, out, err = run_cli("plan", str(examples / "smoke.yaml"), "--json", "--no-validate")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["profile"] == "smoke" and doc["coverage"] == "2-way"
    assert doc["cells"], "a plan with no cells"
    cell = doc["cells"][0]
    assert set(cell) >= {"id", "name", "model", "gpu", "gpu_count", "ray_label", "workload", "flags", "command",
                         "gpu_hours"}
    assert cell["command"][:2] == ["vllm", "serve"]
    assert doc["cost"]["gpu_hours"] == pytest.approx(sum(c["gpu_hours"] for c in doc["cells"]), abs=0.01)
    assert set(doc["cost"]["by_gpu"]) <= {"H200", "H20", "RTX5090"}
    code2, out2, _ = run_cli("plan", str(examples / "smoke.yaml"), "--json", "--no-validate")
    assert out2 == out   # byte-for-byte stable


def test_plan_text_shows_cells_exclusions_and_cost(examples, capsys):
    assert main(["plan", str(examples / "demo.yaml")]) == 0
    out = capsys.readouterr().out
    assert "tiny-moe|H200|" in out and "$ vllm serve soakmatrix/tiny-moe" in out
    assert "excluded (" in out and "needs more than the 1 GPU(s) per node of RTX5090" in out
    assert "vLLM argv check:" in out
    assert "total" in out and "GPU-h" in out


def test_plan_says_when_vllm_check_is_skipped(examples, capsys):
    main(["plan", str(examples / "demo.yaml"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["validation"].startswith(("skipped", "checked"))


def test_bad_matrix_exits_2_with_file_line_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m: {path: x}\ngpus:\n  H200: {count: 8, memory_gb: 141}\naxes:\n  tpp: [1]\n")
    code, out, err = run_cli("plan", str(bad))
    assert code == 2
    assert f"{bad}:6: axes.tpp: unknown flag 'tpp'" in err


def test_unknown_profile_exits_2(examples):
    code, _, err = run_cli("plan", str(examples / "demo.yaml"), "--profile", "nope")
    assert code == 2 and "no profile 'nope'" in err


def test_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ["plan", "run", "smoke", "bisect", "report", "sim-engine"]:
        assert command in out


def test_a_reader_that_went_away_is_no_internal_error(examples):
    # `soakmatrix plan ... | head -1`: head exits before the plan is written
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "plan", str(examples / "smoke.yaml"),
                               "--json", "--no-validate"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
