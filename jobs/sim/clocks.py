"""vLLM's clocks for one run of the simulated engine, before and after `--time-scale`.

The stats-line interval, the shm ring-buffer warning interval and the RPC timeout come from vLLM's
own environment variables (`VLLM_LOG_STATS_INTERVAL`, `VLLM_RINGBUFFER_WARNING_INTERVAL`,
`VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`); a planted hang runs on them divided by the time scale, so a
38-minute wait takes seconds. The API server and the engine core each read them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass
class Clocks:
    """vLLM's clocks for this run, before and after `--time-scale`."""

    time_scale: float
    stats_interval_nominal: float
    ring_warning_nominal: float
    rpc_timeout_nominal: float

    STATS_FLOOR_S = 0.5

    @classmethod
    def from_env(cls, time_scale: float) -> Clocks:
        return cls(
            time_scale,
            env_seconds("VLLM_LOG_STATS_INTERVAL", 10.0),
            env_seconds("VLLM_RINGBUFFER_WARNING_INTERVAL", 60.0),
            env_seconds("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", 300.0),
        )

    @property
    def stats_interval_s(self) -> float:
        return max(self.STATS_FLOOR_S, self.stats_interval_nominal / self.time_scale)

    @property
    def ring_warning_s(self) -> float:
        return max(0.01, self.ring_warning_nominal / self.time_scale)

    # vLLM's engine lives 4 minutes after its first shm warning (60 s, then the 300 s RPC timeout):
    # time for a soak job to see the stuck engine and take its stacks. Scaled by 150 that is 1.6 s,
    # less than detection and py-spy take on a busy machine, and the job then found a dead engine
    # (the same planted hang got a second fingerprint). The scaled engine keeps at least this long
    # after its first warning, never longer than vLLM itself would. 5 s was not enough: with both
    # cores busy, detection took up to 1.1 s and `py-spy dump --native` of the tree 3-6 s, and CI
    # once lost the stuck worker's stacks.
    EVIDENCE_WINDOW_S = 20.0

    @property
    def rpc_timeout_s(self) -> float:
        window = min(self.rpc_timeout_nominal, self.ring_warning_s + self.EVIDENCE_WINDOW_S)
        return max(0.01, self.rpc_timeout_nominal / self.time_scale, window)
