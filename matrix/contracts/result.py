"""`CellResult`: what one soak of one cell found, JSON-serialisable (fields: docs/reference/outputs.md).

Written by the soak job, stored by the history store, turned into JUnit and dashboards. Adding a
field is fine; renaming or removing one breaks stored history and users' scripts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .outcomes import Outcome

# the fields a result's free-form `extra` dict held until they were named; an old result.json or
# history row with `extra` loads into them
FROM_EXTRA = (
    "startup_s",
    "load_start_delay_s",
    "wall_exposure_s",
    "time_scale",
    "load",
    "health",
    "verdict",
    "causes",
    "evidence_s",
    "stacks_unreachable",
    "stalls",
    "true_hang",
    "latency_from_true_start_s",
    "teardown",
    "leak",
    "ray_node_id",
    "preflight",
    "regression",
    "url",
    "pid",
)


@dataclass
class CellResult:
    cell_id: str
    cell_name: str
    outcome: Outcome
    model: str = ""
    gpu_type: str = ""
    workload: str = ""
    flags: dict[str, Any] = field(default_factory=dict)
    signature: str | None = None  # e.g. shm_broadcast_timeout
    fingerprint: str | None = None  # hash of the stuck frames, groups one bug across cells
    detector: str | None = None  # the watchdog detector that fired
    message: str = ""  # what stopped and when, or why it errored
    time_to_hang_s: float | None = None  # seconds under load before the hang began (detected)
    detected_after_s: float | None = None  # seconds from the hang's last progress to the verdict
    exposure_s: float = 0.0  # seconds under load
    tokens: int = 0  # generated tokens completed
    requests: int = 0  # requests completed
    node: str = ""
    gpu_count: int = 0
    engine: str = ""  # "sim" | "vllm"
    vllm_version: str = ""
    build: str = ""  # the engine build (matrix `builds:`); "" without builds
    build_ordinal: int | None = None  # its place in the matrix's builds: the history order
    python: str = ""  # the soak job's interpreter: a pip build's virtualenv, py_executable
    started_at: float = field(default_factory=time.time)
    ended_at: float = 0.0
    attempt: int = 1  # 1 + infra retries before this result
    retries: list[str] = field(default_factory=list)  # messages of earlier infra errors
    stuck_frames: list[str] = field(default_factory=list)  # the culprit thread's frames, innermost first
    culprit: str = ""  # "<role> <thread>: why it is the culprit" (jobs/culprit.py)
    threads: list[dict[str, Any]] = field(default_factory=list)  # per role: culprits, then victims
    gpu_state: dict[str, Any] = field(default_factory=dict)  # per-GPU use at the hang, "state": busy|idle
    log_tail: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> path
    # what a free-form `extra` dict held before (FROM_EXTRA): the soak's timings and load
    startup_s: float | None = None  # wall seconds from the server's start to ready
    load_start_delay_s: float | None = None  # wall seconds from the driver's start to the first request sent
    wall_exposure_s: float | None = None  # exposure_s in wall seconds (before the time scale)
    time_scale: float = 1.0  # engine seconds per wall second (the simulated engine's time_scale)
    load: dict[str, Any] = field(default_factory=dict)  # the load driver's summary: tokens, completed, latencies
    health: dict[str, Any] = field(default_factory=dict)  # the watchdog's /health summary over the soak
    # the finding: the verdict and its evidence
    verdict: dict[str, Any] = field(default_factory=dict)  # detector, kind, at, since, message, hint, details
    causes: list[str] = field(default_factory=list)  # the classifier's causes, likeliest first
    evidence_s: float | None = None  # seconds the evidence took (stacks, metrics, log, GPU state)
    stacks_unreachable: str | None = None  # why no process could be dumped (ptrace denied, gone)
    stalls: list[dict[str, Any]] = field(default_factory=list)  # stalls that recovered: the watch went on
    true_hang: dict[str, Any] = field(default_factory=dict)  # the simulated engine's record of the planted hang
    latency_from_true_start_s: float | None = None  # verdict time minus the planted hang's true start
    # the server's end
    teardown: dict[str, Any] = field(default_factory=dict)  # clean, pids, survivors, port_listening, gpu_pids, ...
    leak: str = ""  # what the teardown left behind ("" when clean)
    # where it ran (the scheduler) and what reports add
    ray_node_id: str = ""  # the Ray node the cell ran on
    preflight: dict[str, Any] = field(default_factory=dict)  # that node's preflight report (jobs/doctor)
    regression: dict[str, str] = field(default_factory=dict)  # JUnit's regression.* properties, where one explains it
    # a watched server (`soakmatrix watch`)
    url: str = ""  # the watched server's URL, credentials masked
    pid: int | None = None  # the watched server's root pid

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
    def from_dict(cls, data: Mapping[str, Any]) -> CellResult:
        """A result from its JSON form; one written before the named fields keeps them in `extra`,
        whose known keys become those fields (a key written both ways: the field wins)."""
        known = {f.name for f in fields(cls)}
        old = data.get("extra")
        merged = {**{k: v for k, v in old.items() if k in FROM_EXTRA}, **data} if isinstance(old, Mapping) else data
        return cls(**{k: v for k, v in merged.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> CellResult:
        return cls.from_dict(json.loads(text))
