"""Answers recorded before the layout moves (issue 17): the same seeds must give the same bytes.

`bisect --virtual --json` is deterministic for a seed, and `plan --json` for a matrix file; both are
contracts users script against, so a refactor that changes a byte of them changed behaviour.
Re-record only for a deliberate change of an answer, and say so in the commit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow   # every answer is the CLI's, run as a subprocess

RECORDED = REPO / "tests" / "data" / "recorded"
BISECT_CASES = json.loads((RECORDED / "virtual_answers.json").read_text())


def soakmatrix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.parametrize("case", BISECT_CASES, ids=[" ".join(c["args"][3:]) for c in BISECT_CASES])
def test_virtual_bisect_answers_are_byte_identical(case):
    out = soakmatrix("bisect", *case["args"], "--virtual", "--json", "--quiet")
    assert out.returncode == case["exit"], out.stderr
    assert out.stdout == case["stdout"]


@pytest.mark.parametrize("name", ["demo", "nightly", "smoke"])
def test_plan_json_is_byte_identical(name):
    out = soakmatrix("plan", f"matrix/examples/{name}.yaml", "--json", "--no-validate")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (RECORDED / f"plan_{name}.json").read_text()
