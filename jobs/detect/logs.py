"""Log detector: the lines vLLM prints when it is stuck or dying.

shm_broadcast waits (`No available shared memory broadcast block found`), `RPC call to X timed
out`, `EngineDeadError` / `EngineCore encountered a fatal error`, CUDA and NCCL errors, out of
memory. An shm warning counts only while requests are in flight (seed 004's idle engine prints it
too, but then the hang is proven by the RPC timeout that follows). The patterns are a plain list, most specific first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from soakmatrix.jobs.signatures import CUDA_ERROR, ENGINE_DEAD, NCCL_TIMEOUT, OOM, RPC_TIMEOUT, SHM_WARNING

from .protocol import HangVerdict, Tick, register


@dataclass(frozen=True)
class LogPattern:
    pattern: re.Pattern
    kind: str  # "hang" | "crash"
    hint: str  # the signature this line points at
    needs_load: bool = False  # only a finding while requests are in flight


LOG_PATTERNS: list[LogPattern] = [
    LogPattern(OOM, "crash", "oom"),
    LogPattern(CUDA_ERROR, "crash", "cuda_error"),
    LogPattern(NCCL_TIMEOUT, "hang", "nccl_timeout"),
    LogPattern(RPC_TIMEOUT, "hang", "shm_broadcast_timeout"),
    LogPattern(SHM_WARNING, "hang", "shm_broadcast_timeout", needs_load=True),
    LogPattern(ENGINE_DEAD, "crash", "engine_dead"),
]


class LogDetector:
    name = "logs"

    def __init__(self, patterns: list[LogPattern] | None = None) -> None:
        self.patterns = LOG_PATTERNS if patterns is None else patterns
        self.seen: list[str] = []  # every matching line, for the classifier and the report

    def observe(self, obs: Tick) -> HangVerdict | None:
        loaded = obs.stream is not None and obs.stream.open_streams > 0
        if obs.metrics is not None and (obs.metrics.running or 0) > 0:
            loaded = True
        best: tuple[int, LogPattern, str] | None = None
        for line in obs.log_lines:
            for rank, p in enumerate(self.patterns):
                if not p.pattern.search(line):
                    continue
                self.seen.append(line)
                if p.needs_load and not loaded:
                    continue
                if best is None or rank < best[0]:
                    best = (rank, p, line)  # the most specific line of this tick wins (list order)
        if best is None:
            return None
        _, p, line = best
        return HangVerdict(
            detector=self.name,
            kind=p.kind,
            at=obs.now,
            since=None,
            message=f"server log: {line.strip()[:300]}",
            hint=p.hint,
            details={"line": line.strip()},
        )


register("logs")(LogDetector)
