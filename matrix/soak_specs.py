"""From a planned cell to the `SoakSpec` a node runs: the one place the planner's view becomes the job's.

`soakmatrix run`, the bisection's soak oracle and the pytest plugin's matrix cells all build their
specs here, so a cell soaks the same way whichever of them asked; the first two also take the wall
clock's view of a matrix from here (`matrix_time_scale`, `startup_timeout_s`) to size their caps.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec, effective_time_scale

from .builds import build_env, runtime_env_for
from .plan import PlannedCell
from .spec import Matrix


def soak_spec_for(
    pc: PlannedCell, matrix: Matrix, backend: str = "sim", out_dir: str | Path = "soak-out", **overrides: Any
) -> SoakSpec:
    """The spec of planned cell `pc`; `overrides` replace any field (a shorter soak, another seed)."""
    spec = SoakSpec(
        cell_id=pc.id,
        cell_name=pc.name,
        model=pc.cell.model,
        model_path=pc.model_path,
        gpu_type=pc.cell.gpu,
        gpu_count=pc.gpu_count,
        workload=matrix.workloads[pc.cell.workload],
        flags=pc.cell.flag_dict,
        serve_args=pc.serve_args,
        env=dict(pc.env),
        soak_s=pc.soak_s,
        startup_timeout_s=startup_timeout_s(pc.startup_s),
        backend=backend,
        artifacts_dir=str(Path(out_dir) / "cells" / pc.id),
        hang_model=matrix.sim.hang_model,
        time_scale=matrix.sim.time_scale,
    )
    if pc.build is not None:  # a matrix without builds leaves the spec as it always was
        spec = replace(
            spec,
            env={**spec.env, **build_env(pc.build)},
            build=pc.build.name,
            build_ordinal=pc.build.ordinal,
            runtime_env=runtime_env_for(pc.build),
        )
    return replace(spec, **overrides) if overrides else spec


def startup_timeout_s(expected_startup_s: float) -> float:
    """How long a server may take to become ready: half again the profile's expected start-up, and
    never under two minutes (a small model's start-up varies more than it weighs)."""
    return max(120.0, 1.5 * expected_startup_s)


def matrix_time_scale(matrix: Matrix, backend: str) -> float:
    """How many times faster than the wall clock a matrix's durations pass on `backend`
    (`jobs.soak_spec.effective_time_scale`: the matrix's `sim.time_scale` for the simulated engine)."""
    return effective_time_scale(backend, matrix.sim.time_scale)
