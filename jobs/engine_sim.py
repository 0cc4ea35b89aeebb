"""The simulated engine as an `Engine` (jobs/engine.py): `soakmatrix sim-engine` with the cell's flags."""

from __future__ import annotations

import sys

from .engine import LaunchCommand
from .soak_spec import SoakSpec

SIM_VERSION = "0.1.0"


class SimEngine:
    name = "sim"

    def command(self, spec: SoakSpec, host: str, port: int) -> LaunchCommand:
        argv = [sys.executable, "-m", "soakmatrix.matrix.cli", "sim-engine", spec.model_path, *spec.serve_args,
                "--host", host, "--port", str(port), "--gpu-type", spec.gpu_type, "--seed", str(spec.seed),
                "--time-scale", str(spec.time_scale), "--hang-record", f"{spec.artifacts_dir}/sim-hangs.jsonl"]
        if spec.hang_model:
            argv += ["--hang-model", str(spec.hang_model)]
        return LaunchCommand(argv=argv, env=dict(spec.env))

    def version(self) -> str:
        return f"sim {SIM_VERSION}"
