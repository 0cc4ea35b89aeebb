"""Outcomes of a cell and the CLI's exit codes, as data.

Exit-code ranges keep infrastructure trouble apart from findings (as Ray's release tooling does):
0 every cell passed; 1 a hang or crash was found; 2 usage or configuration error; 3 no verdict.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Outcome(str, enum.Enum):
    PASSED = "passed"
    HANG = "hang"
    CRASH = "crash"
    CONFIG_ERROR = "config_error"  # the engine rejected the flags
    INFRA_ERROR = "infra_error"  # node lost, port taken, GPU busy, overran its cap: retried

    @property
    def is_finding(self) -> bool:
        """A hang or crash is what soakmatrix looks for: never retried."""
        return self in (Outcome.HANG, Outcome.CRASH)

    @property
    def retryable(self) -> bool:
        return self is Outcome.INFRA_ERROR


EXIT_OK = 0
EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_INFRA = 3


def exit_code(outcomes: Iterable[Outcome]) -> int:
    """The run's exit code: a finding outranks a config error, which outranks an infra error."""
    seen = {Outcome(o) for o in outcomes}
    if seen & {Outcome.HANG, Outcome.CRASH}:
        return EXIT_FOUND
    if Outcome.CONFIG_ERROR in seen:
        return EXIT_USAGE
    if Outcome.INFRA_ERROR in seen:
        return EXIT_INFRA
    return EXIT_OK
