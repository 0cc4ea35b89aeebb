"""Loading and planning a matrix: `load_matrix(path)` and `plan(matrix, profile)`.

A matrix file's mistakes raise `SpecError` with every problem as file:line: key: message; a plan is
the profile's cells (each a `PlannedCell`: its flags, argv, environment, GPU count and cost), the
combinations excluded and why. Both are pure: nothing runs, nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from soakmatrix.matrix.plan import Plan, PlannedCell
from soakmatrix.matrix.plan import plan as _plan
from soakmatrix.matrix.spec import load_matrix as _load
from soakmatrix.matrix.spec_types import Matrix

from .errors import UsageError


def load_matrix(path: str | Path, text: str | None = None) -> Matrix:
    """The matrix in the YAML file at `path` (or in `text`, named `path` in messages), validated."""
    return _load(path, text)


def as_matrix(matrix: Matrix | str | Path) -> Matrix:
    """A matrix as given, or loaded from its file."""
    return matrix if isinstance(matrix, Matrix) else load_matrix(matrix)


def plan(
    matrix: Matrix | str | Path, profile: str | None = None, *, backend: str = "sim", on_rejected: Any = None
) -> Plan:
    """The cells `profile` (default: the matrix's first) will run. With `backend="vllm"` each argv is
    first checked by vLLM's own parser where vLLM is importable; the cells it refuses are left out and
    listed in `Plan.rejected` (`on_rejected(exclusion)` hears each one)."""
    m = as_matrix(matrix)
    validate = None
    if backend == "vllm":
        from soakmatrix.matrix.validate import validate_cells

        validate = validate_cells
    result = _plan(m, profile, validate=validate)
    for rejected in result.rejected:
        if on_rejected is not None:
            on_rejected(rejected)
    return result


def find_cell(planned: Plan, cell: str | PlannedCell) -> PlannedCell:
    """The planned cell whose id or name is `cell` (or whose id alone starts with it, 4+ characters)."""
    if isinstance(cell, PlannedCell):
        return cell
    from soakmatrix.matrix.bisect.setup import find_cell as _find

    try:
        return _find(planned.cells, cell, planned.matrix)
    except LookupError as exc:
        raise UsageError(str(exc)) from None
