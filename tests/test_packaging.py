"""The wheel holds every module under its import name (soakmatrix.<folder>.<module>) and the data files."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ["matrix", "jobs", "fixtures", "reports"]


@pytest.mark.slow
def test_wheel_contains_every_module_under_its_import_name(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("soakmatrix-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"soakmatrix/{folder}/{path.relative_to(REPO / folder).as_posix()}"
                for folder in FOLDERS for path in (REPO / folder).rglob("*.py")
                if "__pycache__" not in path.parts}
    expected |= {f"soakmatrix/api/{path.name}" for path in (REPO / "soakmatrix" / "api").glob("*.py")}
    missing = sorted(expected - names)
    assert not missing, f"modules missing from the wheel: {missing}"
    assert not any(n.startswith(("matrix/", "jobs/", "fixtures/", "reports/")) for n in names), \
        "a folder was packaged at the top level, where it would collide in users' environments"
    for example in [*(REPO / "matrix" / "examples").rglob("*.yaml"), *(REPO / "matrix" / "examples").rglob("*.txt")]:
        assert f"soakmatrix/matrix/{example.relative_to(REPO / 'matrix').as_posix()}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "soakmatrix = soakmatrix.matrix.cli:main" in text


def test_every_package_folder_is_listed_in_pyproject():
    """The quick half of the wheel test: a new subpackage missing from `packages` would be left out."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"soakmatrix." + ".".join(init.parent.relative_to(REPO).parts)
               for folder in FOLDERS for init in (REPO / folder).rglob("__init__.py")
               if "__pycache__" not in init.parts}
    assert sorted(folders - listed) == [], "add these to [tool.setuptools] packages"
    assert "soakmatrix" in listed   # the top level: __version__ and the API's names
    assert {"soakmatrix." + init.parent.name for init in (REPO / "soakmatrix").glob("*/__init__.py")} <= listed
