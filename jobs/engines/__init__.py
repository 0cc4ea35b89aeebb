"""Engines: what to run for one cell. The interface is `protocol.py`, one implementation per file, and
the registry below maps an engine's name to its class (a plain dict that tests and users extend)."""

from __future__ import annotations

from .protocol import Engine, LaunchCommand

__all__ = ["ENGINES", "Engine", "LaunchCommand", "get_engine"]

ENGINES: dict[str, str] = {
    # name -> "module:Class"; a plain dict so tests and users can add engines
    "sim": "soakmatrix.jobs.engines.sim:SimEngine",
    "vllm": "soakmatrix.jobs.engines.vllm:VllmEngine",
}


def get_engine(name: str) -> Engine:
    import importlib

    if name not in ENGINES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
