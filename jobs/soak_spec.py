"""`SoakSpec`: everything a node needs to soak one cell, built from a planned cell.

It crosses the Ray boundary (pickled) and is the single argument of `jobs.soak.run_cell`, so it
holds plain values only: no Matrix, no open files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec import Matrix, Workload


@dataclass(frozen=True)
class SoakSpec:
    cell_id: str
    cell_name: str
    model: str
    model_path: str
    gpu_type: str
    gpu_count: int
    workload: Workload
    flags: Mapping[str, Any]
    serve_args: tuple[str, ...]        # after `vllm serve MODEL`; the engine adds --host/--port
    env: Mapping[str, str] = field(default_factory=dict)
    soak_s: float = 600.0              # seconds of load unless a hang ends it sooner
    startup_timeout_s: float = 900.0   # not ready by then: infra_error (or config_error if it exited)
    backend: str = "sim"               # "sim" | "vllm"
    artifacts_dir: str = "soak-out"
    hang_model: str | None = None      # sim engine / fault plugin: the hang-model file
    time_scale: float = 1.0            # sim engine: every duration divided by this
    seed: int = 0
    attempt: int = 1

    @classmethod
    def from_planned(cls, pc: PlannedCell, matrix: Matrix, backend: str = "sim",
                     out_dir: str | Path = "soak-out", **overrides: Any) -> "SoakSpec":
        spec = cls(
            cell_id=pc.id, cell_name=pc.name, model=pc.cell.model, model_path=pc.model_path,
            gpu_type=pc.cell.gpu, gpu_count=pc.gpu_count, workload=matrix.workloads[pc.cell.workload],
            flags=pc.cell.flag_dict, serve_args=pc.serve_args, env=dict(pc.env), soak_s=pc.soak_s,
            startup_timeout_s=max(120.0, 1.5 * pc.startup_s), backend=backend,
            artifacts_dir=str(Path(out_dir) / "cells" / pc.id),
            hang_model=matrix.sim.hang_model, time_scale=matrix.sim.time_scale,
        )
        return replace(spec, **overrides) if overrides else spec
