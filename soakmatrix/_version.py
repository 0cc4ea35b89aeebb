"""The version of soakmatrix: the installed distribution's, else the source checkout's pyproject.toml."""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "soakmatrix"
UNKNOWN = "0+unknown"


@functools.cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        # a checkout on sys.path without `pip install`: the version the next install would get
        return version_in(Path(__file__).resolve().parent.parent / "pyproject.toml")


def version_in(pyproject: Path) -> str:
    """`project.version` of a pyproject.toml, or UNKNOWN when there is none to read."""
    try:
        with pyproject.open("rb") as f:
            found = tomllib.load(f).get("project", {}).get("version")
    except (OSError, tomllib.TOMLDecodeError):
        return UNKNOWN
    return found if isinstance(found, str) and found else UNKNOWN
