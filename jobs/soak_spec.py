"""`SoakSpec`: everything a node needs to soak one cell (the planner builds it: `matrix/soak_specs.py`).

It crosses the Ray boundary (pickled) and is the single argument of `jobs.soak.run_cell`, so it
holds plain values only: no Matrix, no open files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from soakmatrix.matrix.contracts.workloads import Workload


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
    serve_args: tuple[str, ...]  # after `vllm serve MODEL`; the engine adds --host/--port
    env: Mapping[str, str] = field(default_factory=dict)
    soak_s: float = 600.0  # seconds of load unless a hang ends it sooner
    startup_timeout_s: float = 900.0  # not ready by then: infra_error (or config_error if it exited)
    backend: str = "sim"  # "sim" | "vllm"
    artifacts_dir: str = "soak-out"
    hang_model: str | None = None  # sim engine / fault plugin: the hang-model file
    time_scale: float = 1.0  # sim engine: every duration divided by this
    seed: int = 0
    attempt: int = 1
    build: str = ""  # the engine build's name (matrix `builds:`); "" without builds
    build_ordinal: int | None = None  # its place in the matrix's builds (history order)
    runtime_env: Mapping[str, Any] | None = None  # Ray's runtime_env for the cell's task (the build)


def effective_time_scale(backend: str, time_scale: float) -> float:
    """How many times faster than the wall clock the engine's clock runs: the simulated engine's
    `time_scale`, 1.0 for the real engine. A scale that is not positive (no valid matrix or marker
    has one) counts as 1.0."""
    return time_scale if backend == "sim" and time_scale > 0 else 1.0
