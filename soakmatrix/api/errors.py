"""The one error the API adds: `UsageError`, an input that cannot run (an unknown cell, a hang model
that plants no such signature, a store that is not one). The CLI prints it and exits 2. A matrix
file's own mistakes are `SpecError`s (file:line: key: message), also exit 2."""

from __future__ import annotations


class UsageError(ValueError):
    """An argument or an input file that cannot be used; nothing was run (message: what and why)."""
