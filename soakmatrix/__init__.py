"""soakmatrix: find the vLLM flag combinations that hang, bisect them, and watch production servers.

The Python API (docs/api.md) is a few verbs with typed inputs and answers, all importable from here:

    load_matrix(path) -> Matrix            plan(matrix, profile) -> Plan
    run(matrix, ...) -> RunResult          bisect_flags(matrix, cell, ...) -> FlagBisection
    bisect_builds(matrix, cell, builds, ...) -> BuildBisection
    watch(url, ...) -> WatchResult         simulated_server(...) -> SimulatedServer

The `soakmatrix` command is a thin layer over them. The code lives in four folders that install as
subpackages: `soakmatrix.matrix` (the matrix, planning, scheduling on Ray, bisection, the CLI),
`soakmatrix.jobs` (one soak of one cell, `watch`), `soakmatrix.fixtures` (the pytest and vLLM
plugins) and `soakmatrix.reports` (JUnit, the history store, the dashboard). Importing this package
loads none of them: each name is imported on first use, and only the verbs that need Ray, plotly or
scipy import them, when they run.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

# a source checkout's `soakmatrix/` (first on sys.path when run from the checkout) holds this file
# and the API only: an installed copy's subpackages stay reachable beside it
__path__ = pkgutil.extend_path(__path__, __name__)

from soakmatrix._version import version as _version_of

# public name -> the module it comes from
_EXPORTS: dict[str, str] = {
    "load_matrix": "soakmatrix.api.matrices",
    "plan": "soakmatrix.api.matrices",
    "run": "soakmatrix.api.running",
    "bisect_flags": "soakmatrix.api.flags",
    "bisect_builds": "soakmatrix.api.builds",
    "watch": "soakmatrix.api.watching",
    "simulated_server": "soakmatrix.api.watching",
    "SimulatedServer": "soakmatrix.api.watching",
    "UsageError": "soakmatrix.api.errors",
    "BisectOptions": "soakmatrix.api.types",
    "FlagBisection": "soakmatrix.api.types",
    "BuildBisection": "soakmatrix.api.types",
    "CellEvent": "soakmatrix.api.types",
    "WatchResult": "soakmatrix.api.types",
    "RunOptions": "soakmatrix.matrix.run_types",
    "RunResult": "soakmatrix.matrix.run_types",
    "Matrix": "soakmatrix.matrix.spec_types",
    "Profile": "soakmatrix.matrix.spec_types",
    "Plan": "soakmatrix.matrix.plan",
    "PlannedCell": "soakmatrix.matrix.plan",
    "CellResult": "soakmatrix.matrix.contracts.result",
    "Outcome": "soakmatrix.matrix.contracts.outcomes",
    "SpecError": "soakmatrix.matrix.contracts.yamlsrc",
}

# spelled out, so that type checkers and IDEs see the public names (tests/test_api.py holds it to _EXPORTS)
__all__ = [
    "__version__",
    "load_matrix",
    "plan",
    "run",
    "bisect_flags",
    "bisect_builds",
    "watch",
    "simulated_server",
    "SimulatedServer",
    "UsageError",
    "BisectOptions",
    "FlagBisection",
    "BuildBisection",
    "CellEvent",
    "WatchResult",
    "RunOptions",
    "RunResult",
    "Matrix",
    "Profile",
    "Plan",
    "PlannedCell",
    "CellResult",
    "Outcome",
    "SpecError",
]


def __getattr__(name: str) -> Any:
    # computed on first use: every `import soakmatrix.<folder>` runs this file, and most never ask
    if name == "__version__":
        return _version_of()
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'soakmatrix' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
