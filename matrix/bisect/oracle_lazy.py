"""The soak oracle started at the first probe a bisection's journal cannot answer: a resumed bisection
whose journal holds every answer (a finished run, a recorded one) connects to no Ray cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SoakOnFirstProbe:
    """The soak oracle, connected to Ray when the first probe the journal cannot answer is asked: a
    resumed bisection whose journal answers every probe (a finished run, a recorded one) starts no
    cluster. `started()` connects at once (a fresh bisection, so that an unreachable cluster is exit 2
    before anything else is said)."""

    def __init__(self, start: Callable[[], tuple[Any, Any]]):
        self._start = start
        self._oracle: Any = None
        self._cluster: Any = None

    def started(self) -> SoakOnFirstProbe:
        if self._oracle is None:
            self._oracle, self._cluster = self._start()
        return self

    def run(self, probes: Any) -> Any:
        return self.started()._oracle.run(probes)

    def resume_after(self, rounds: int, probes: int) -> None:
        inner = getattr(self.started()._oracle, "resume_after", None)
        if inner is not None:
            inner(rounds, probes)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
