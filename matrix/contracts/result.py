"""`CellResult`: what one soak of one cell found, JSON-serialisable (fields: docs/reference/outputs.md).

Written by the soak job, stored by the history store, turned into JUnit and dashboards. Adding a
field is fine; renaming or removing one breaks stored history and users' scripts.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from .outcomes import Outcome


@dataclass
class CellResult:
    cell_id: str
    cell_name: str
    outcome: Outcome
    model: str = ""
    gpu_type: str = ""
    workload: str = ""
    flags: dict[str, Any] = field(default_factory=dict)
    signature: str | None = None           # e.g. shm_broadcast_timeout
    fingerprint: str | None = None         # hash of the stuck frames, groups one bug across cells
    detector: str | None = None            # the watchdog detector that fired
    message: str = ""                      # what stopped and when, or why it errored
    time_to_hang_s: float | None = None    # seconds under load before the hang began (detected)
    detected_after_s: float | None = None  # seconds from the hang's last progress to the verdict
    exposure_s: float = 0.0                # seconds under load
    tokens: int = 0                        # generated tokens completed
    requests: int = 0                      # requests completed
    node: str = ""
    gpu_count: int = 0
    engine: str = ""                       # "sim" | "vllm"
    vllm_version: str = ""
    build: str = ""                        # the engine build (matrix `builds:`); "" without builds
    build_ordinal: int | None = None       # its place in the matrix's builds: the history order
    python: str = ""                       # the soak job's interpreter: a pip build's virtualenv, py_executable
    started_at: float = field(default_factory=time.time)
    ended_at: float = 0.0
    attempt: int = 1                       # 1 + infra retries before this result
    retries: list[str] = field(default_factory=list)   # messages of earlier infra errors
    stuck_frames: list[str] = field(default_factory=list)   # the culprit thread's frames, innermost first
    culprit: str = ""                      # "<role> <thread>: why it is the culprit" (jobs/culprit.py)
    threads: list[dict[str, Any]] = field(default_factory=list)   # per role: culprits, then victims
    gpu_state: dict[str, Any] = field(default_factory=dict)       # per-GPU use at the hang, "state": busy|idle
    log_tail: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> path
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.ended_at or self.started_at) - self.started_at)

    @property
    def gpu_hours(self) -> float:
        return self.gpu_count * self.duration_s / 3600.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CellResult":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "CellResult":
        return cls.from_dict(json.loads(text))
