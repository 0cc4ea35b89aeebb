"""soakmatrix: find the vLLM flag combinations that hang, bisect them, and watch production servers.

The code lives in four folders that install as subpackages: `soakmatrix.matrix` (the matrix, planning,
scheduling on Ray, bisection, the CLI), `soakmatrix.jobs` (one soak of one cell, `watch`),
`soakmatrix.fixtures` (the pytest and vLLM plugins) and `soakmatrix.reports` (JUnit, the history
store, the dashboard). Importing this package loads none of them.
"""

from __future__ import annotations

import pkgutil

# a source checkout's `soakmatrix/` (first on sys.path when run from the checkout) holds this file
# only: an installed copy's subpackages stay reachable beside it
__path__ = pkgutil.extend_path(__path__, __name__)

from soakmatrix._version import version as _version_of  # noqa: E402 - after __path__ is complete

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # computed on first use: every `import soakmatrix.<folder>` runs this file, and most never ask
    if name == "__version__":
        return _version_of()
    raise AttributeError(f"module 'soakmatrix' has no attribute {name!r}")
