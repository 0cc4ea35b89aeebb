"""From a planned cell to the `SoakSpec` a node runs: the one place the planner's view becomes the job's.

`soakmatrix run`, the bisection's soak oracle and the pytest plugin's matrix cells all build their
specs here, so a cell soaks the same way whichever of them asked.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec

from .plan import PlannedCell
from .spec import Matrix


def soak_spec_for(pc: PlannedCell, matrix: Matrix, backend: str = "sim",
                  out_dir: str | Path = "soak-out", **overrides: Any) -> SoakSpec:
    """The spec of planned cell `pc`; `overrides` replace any field (a shorter soak, another seed)."""
    spec = SoakSpec(
        cell_id=pc.id, cell_name=pc.name, model=pc.cell.model, model_path=pc.model_path,
        gpu_type=pc.cell.gpu, gpu_count=pc.gpu_count, workload=matrix.workloads[pc.cell.workload],
        flags=pc.cell.flag_dict, serve_args=pc.serve_args, env=dict(pc.env), soak_s=pc.soak_s,
        startup_timeout_s=max(120.0, 1.5 * pc.startup_s), backend=backend,
        artifacts_dir=str(Path(out_dir) / "cells" / pc.id),
        hang_model=matrix.sim.hang_model, time_scale=matrix.sim.time_scale,
    )
    return replace(spec, **overrides) if overrides else spec
