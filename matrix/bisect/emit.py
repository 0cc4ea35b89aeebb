"""The `--emit-test` regression test: a pytest file whose soak marker (`fixtures/`) soaks the
minimal set for the certified duration, so the hang fails CI until it is fixed."""

from __future__ import annotations

import re
from pathlib import Path

from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec import Matrix

from .model import BisectResult


def write_regression_test(
    path: str | Path, result: BisectResult, pc: PlannedCell, matrix: Matrix, backend: str, hang_model: str | None
) -> Path:
    """Write the regression test to `path` (whole or not at all), creating its folder."""
    from soakmatrix.reports.files import write_atomic

    source = regression_test(result, pc, matrix, backend, hang_model).encode()
    return write_atomic(Path(path), lambda fh: fh.write(source))


def regression_test(result: BisectResult, pc: PlannedCell, matrix: Matrix, backend: str, hang_model: str | None) -> str:
    """A pytest file (the `fixtures/` soak marker) soaking the minimal set for the certified duration."""
    workload = matrix.workloads[pc.cell.workload]
    wl = {"name": workload.name, "kind": workload.kind, **dict(workload.params)}
    flags = dict(result.minimal_flags)
    sig = result.signature or "hang"
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", f"{sig}_{'_'.join(result.minimal) or 'baseline'}").strip("_").lower()
    duration = round(result.certified_soak_s or 0.0, 1)
    model_path = matrix.models[pc.cell.model].path
    return f'''"""Regression test written by `soakmatrix bisect` for cell {pc.id} ({pc.name}).

Minimal set: {", ".join(result.minimal) or "(baseline)"}; posterior {result.posterior:.4f} at stated confidence
{result.confidence:g}; the soak ({format_duration(duration)}) sees the hang with probability >= {result.confidence:g}.
"""

import pytest


@pytest.mark.soak(model={model_path!r}, engine={backend!r}, flags={flags!r},
                  duration={duration!r}, workload={wl!r},
                  gpu_type={pc.cell.gpu!r}, hang_model={hang_model!r}, time_scale={matrix.sim.time_scale!r},
                  expect="pass")
def test_{name}():
    """Regression test for {sig}: soaks the minimal set for the certified duration."""
'''
