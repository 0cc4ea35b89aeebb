"""`soakmatrix.__version__` and `soakmatrix --version`: the installed distribution's version, else the
source checkout's pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import soakmatrix
from soakmatrix import _version

REPO = Path(__file__).resolve().parent.parent
PYPROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_the_installed_distributions():
    assert soakmatrix.__version__ == metadata.version("soakmatrix") == PYPROJECT_VERSION


def test_the_command_prints_it():
    p = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "--version"], capture_output=True, text=True,
                       timeout=60)
    assert (p.returncode, p.stdout) == (0, f"soakmatrix {PYPROJECT_VERSION}\n"), p.stderr
    top = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert "--version" in top.stdout


def test_a_checkout_without_an_install_reads_pyproject(tmp_path, monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version.metadata, "version", not_installed)
    _version.version.cache_clear()
    try:
        assert _version.version() == PYPROJECT_VERSION
    finally:
        _version.version.cache_clear()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndynamic = ["version"]\n')
    assert _version.version_in(tmp_path / "pyproject.toml") == _version.UNKNOWN
    (tmp_path / "broken.toml").write_text("[project\n")
    assert _version.version_in(tmp_path / "broken.toml") == _version.UNKNOWN
    assert _version.version_in(tmp_path / "absent.toml") == _version.UNKNOWN


def test_an_unknown_attribute_is_an_attribute_error():
    try:
        soakmatrix.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("soakmatrix.no_such_thing did not raise")
