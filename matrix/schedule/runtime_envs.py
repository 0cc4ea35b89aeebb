"""How a cell's engine build reaches its Ray task (matrix/builds.py says which runtime_env): the
task option, the check that a `py_executable` build's interpreter exists on the nodes, and Ray's
`RuntimeEnvSetupError` turned into the build's result. Pure but for `interpreter_present`, which
runs on a node as a tiny Ray task.

Why the interpreter check: Ray starts a worker with a missing `py_executable` over and over and the
task never starts nor fails (Ray 2.60: "Some workers of the worker process have not registered
within the timeout", for ever). Checked first, a build missing on every node is a `config_error`,
and nodes without it are avoided.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from collections.abc import Mapping
from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.builds import setup_error_outcome
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.redact import redact_text
from soakmatrix.matrix.contracts.result import CellResult

MAX_MESSAGE_LINES = 12


def runtime_env_option(spec: SoakSpec) -> dict[str, Any]:
    """The `runtime_env` task option of this cell, or nothing (a matrix without builds)."""
    return {"runtime_env": dict(spec.runtime_env)} if spec.runtime_env else {}


def interpreter_of(runtime_env: Mapping[str, Any] | None) -> str | None:
    """The executable a `py_executable` runtime_env names (its first word: Ray runs it as a command)."""
    command = (runtime_env or {}).get("py_executable")
    if not command:
        return None
    words = shlex.split(str(command))
    return words[0] if words else None


def interpreter_present(executable: str) -> bool:
    """Run on a node: can a worker be started with `executable` here?"""
    if os.path.isabs(executable):
        return os.path.isfile(executable) and os.access(executable, os.X_OK)
    return shutil.which(executable) is not None


def missing_interpreter_result(spec: SoakSpec, executable: str, nodes: int) -> CellResult:
    """No node that could host the cell has the build's interpreter: the build's problem, not a hang."""
    return setup_failure_result(
        spec,
        f"build {spec.build or '?'}: the interpreter {executable} (runtime_env py_executable) is not on "
        f"any of the {nodes} node(s) that could host this cell",
        config=True,
    )


def setup_failure_result(spec: SoakSpec, message: str, *, config: bool | None = None) -> CellResult:
    """A cell whose build Ray could not set up (RuntimeEnvSetupError): config_error or infra_error
    (`matrix.builds.setup_error_outcome`), with Ray's message cut to its first lines."""
    outcome = setup_error_outcome(message) if config is None else Outcome.CONFIG_ERROR
    lines = [line for line in str(message).strip().splitlines() if line.strip()]
    if len(lines) > MAX_MESSAGE_LINES:  # Ray's first line says what failed, pip's last lines why
        lines = [*lines[:2], "[...]", *lines[-(MAX_MESSAGE_LINES - 2) :]]
    text = redact_text("\n".join(lines))  # Ray repeats the runtime_env: a git URL may carry a token
    if config is None:
        text = f"build {spec.build or '?'}: Ray could not set up its runtime_env ({', '.join(sorted(spec.runtime_env or {}))}): {text}"
    now = time.time()
    return CellResult(
        cell_id=spec.cell_id,
        cell_name=spec.cell_name,
        outcome=outcome,
        model=spec.model,
        gpu_type=spec.gpu_type,
        workload=spec.workload.name,
        flags=dict(spec.flags),
        message=text,
        gpu_count=spec.gpu_count,
        engine=spec.backend,
        started_at=now,
        ended_at=now,
        attempt=spec.attempt,
        build=spec.build,
        build_ordinal=spec.build_ordinal,
    )
