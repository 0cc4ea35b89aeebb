"""The simulated engine's model runners: up only once every worker process is."""

from __future__ import annotations

import psutil
import pytest
from tests.conftest import running

from soakmatrix.jobs.sim.args import parse_sim_argv
from soakmatrix.jobs.sim.clocks import Clocks
from soakmatrix.jobs.sim.executor import Executor, worker_main


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


def rank_1_dies_at_start(inbox, outbox, rank, config, parent_pid) -> None:
    """A worker that exits before its READY when it is rank 1 (an import error, the OOM killer)."""
    import os

    if rank == 1:
        os._exit(3)
    worker_main(inbox, outbox, rank, config, parent_pid)


def test_a_worker_that_dies_before_it_is_ready_is_named_with_its_exit_code_and_the_rest_stopped(monkeypatch) -> None:
    from soakmatrix.jobs.sim import executor as executor_module

    monkeypatch.setattr(executor_module, "worker_main", rank_1_dies_at_start)
    before = {c.pid for c in psutil.Process().children()}
    with pytest.raises(RuntimeError, match=r"Worker_TP1 \(pid \d+\) exited with code 3 before it became ready"):
        Executor(parse_sim_argv(["m", "-tp", "2"], environ={}), Clocks.from_env(1.0))
    left = [c.pid for c in psutil.Process().children() if c.pid not in before and running(c)]
    assert left == [], "a worker of the failed start lives on"

