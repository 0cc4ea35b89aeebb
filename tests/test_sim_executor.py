"""The simulated engine's model runners: up only once every worker process is."""

from __future__ import annotations

import psutil

from soakmatrix.jobs.sim.args import parse_sim_argv
from soakmatrix.jobs.sim.clocks import Clocks
from soakmatrix.jobs.sim.executor import Executor


def test_the_executor_is_up_only_once_every_worker_has_its_name_and_loop() -> None:
    """As vLLM's MultiprocExecutor waits for each worker's READY, so /health never answers while a
    forked worker still carries the engine core's name (the process tree a soak job's evidence
    and teardown read)."""
    executor = Executor(parse_sim_argv(["m", "-tp", "4"], environ={}), Clocks.from_env(1.0))
    try:
        assert [psutil.Process(p.pid).name() for p in executor.procs] == [f"VLLM::Worker_TP{r}" for r in range(4)]
        executor.execute_model(0.001)
        assert sorted(executor.sample_tokens(0.001)) == [0, 1, 2, 3]     # every rank answers its first step
    finally:
        executor.shutdown()
    assert not any(p.is_alive() for p in executor.procs)
