"""The simulated engine as an `Engine` (`protocol.py`): `python -m soakmatrix.jobs.sim` (= `soakmatrix sim-engine`) with the cell's flags."""

from __future__ import annotations

import sys

from soakmatrix.jobs.soak_spec import SoakSpec

from .protocol import LaunchCommand

SIM_VERSION = "0.1.0"


class SimEngine:
    name = "sim"

    def command(self, spec: SoakSpec, host: str, port: int) -> LaunchCommand:
        argv = [
            sys.executable,
            "-m",
            "soakmatrix.jobs.sim",
            spec.model_path,
            *spec.serve_args,
            "--host",
            host,
            "--port",
            str(port),
            "--gpu-type",
            spec.gpu_type,
            "--seed",
            str(spec.seed),
            "--time-scale",
            str(spec.time_scale),
            "--hang-record",
            f"{spec.artifacts_dir}/sim-hangs.jsonl",
        ]
        if spec.hang_model:
            argv += ["--hang-model", str(spec.hang_model)]
        return LaunchCommand(argv=argv, env=dict(spec.env))

    def version(self) -> str:
        return f"sim {SIM_VERSION}"
