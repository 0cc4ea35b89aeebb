"""The engine interface: how to start a server for one cell. Implementations, one per file:
`sim.py` (the simulated engine) and `vllm.py` (the real `vllm serve`); the registry is the package's.

An engine only says *what* to run; `jobs/server_process.py` runs it (own process group, log capture,
readiness, teardown), so both engines meet the same lifecycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from soakmatrix.jobs.soak_spec import SoakSpec


@dataclass(frozen=True)
class LaunchCommand:
    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the inherited environment
    cwd: str | None = None


class Engine(Protocol):
    name: str  # "sim" | "vllm"

    def command(self, spec: SoakSpec, host: str, port: int) -> LaunchCommand:
        """The server's argv and environment for this cell, listening on host:port."""
        ...

    def version(self) -> str:
        """The engine's version, recorded in results (`vllm 0.33.0`, `sim 0.1.0`)."""
        ...
