"""The engine interface: how to start a server for one cell. Implementations, one per file:
`engine_sim.py` (the simulated engine) and `engine_vllm.py` (the real `vllm serve`).

An engine only says *what* to run; `launcher.py` runs it (own process group, log capture,
readiness, teardown), so both engines meet the same lifecycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from .soak_spec import SoakSpec


@dataclass(frozen=True)
class LaunchCommand:
    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)   # added to the inherited environment
    cwd: str | None = None


class Engine(Protocol):
    name: str   # "sim" | "vllm"

    def command(self, spec: SoakSpec, host: str, port: int) -> LaunchCommand:
        """The server's argv and environment for this cell, listening on host:port."""
        ...

    def version(self) -> str:
        """The engine's version, recorded in results (`vllm 0.33.0`, `sim 0.1.0`)."""
        ...


ENGINES: dict[str, str] = {
    # name -> "module:Class"; a plain dict so tests and users can add engines
    "sim": "soakmatrix.jobs.engine_sim:SimEngine",
    "vllm": "soakmatrix.jobs.engine_vllm:VllmEngine",
}


def get_engine(name: str) -> Engine:
    import importlib

    if name not in ENGINES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
