"""The simulated engine's model runners: how long a step takes on the simulated GPU, and who spends it.

The engine core broadcasts each step to its model runners over the shm message queue
(`shm_broadcast.py`): worker processes `VLLM::Worker_TP<i>` for TP > 1, a thread for TP = 1. Each
sleeps the step's time and answers. Step times are not scaled by `--time-scale`: a decode step costs
about 10 ms plus 0.2 ms per sequence, a prefill about 0.25 ms per token plus attention over the
context, so a long prompt without chunking makes a legitimately slow step of seconds.

Two hangs happen here: `shm_broadcast` silences one model runner (`sample_tokens_stuck`) while the
engine core waits in `Executor.sample_tokens` -> `MessageQueue.acquire_read` (warnings, then
`RPC call to sample_tokens timed out`); `crash` raises a CUDA error in `Executor.execute_model`.
With `--torch-device` each model runner also runs its step on a real GPU (`torch_device.py`), and
the silent runner of a TP > 1 engine waits in a gloo all-reduce its peers never join.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from .args import SimConfig
from .clocks import Clocks
from .proc import die_with_parent, reset_child_signals, set_process_title, setup_process_logging, vlog
from .scheduler import SchedulerOutput
from .shm_broadcast import MessageQueue


def step_time_s(config: SimConfig, sched: SchedulerOutput, rng: random.Random) -> float:
    """How long a GPU would take for this step (not scaled by --time-scale)."""
    if not sched.items:
        return 0.0
    f = config.flags
    decode = [i for i in sched.items if not i.prefill]
    prefill = [i for i in sched.items if i.prefill]
    t_decode = 0.008 + 0.00022 * len(decode) + 2e-8 * sum(i.req.num_computed for i in decode)
    if config.spec_tokens and decode:
        t_decode *= 1.0 + 0.12 * config.spec_tokens
    if f.get("enforce_eager") or f.get("cudagraph_mode") == "NONE":
        t_decode *= 1.5
    t_prefill = sum(0.00025 * i.tokens + 1.5e-8 * i.tokens * (i.req.num_computed + i.tokens) for i in prefill)
    tp = int(f.get("tp") or 1)
    t = (t_decode + t_prefill) / tp**0.8 + (0.0005 * math.log2(tp) if tp > 1 else 0.0)
    return max(0.001, t * (1.0 + max(-0.1, min(0.1, rng.gauss(0.0, 0.04)))))


def sample_tokens_stuck() -> None:
    """The model runner of an shm_broadcast hang: it never answers the engine core again."""
    # one wait with no timeout: a loop of timed waits can be sampled between two of them, and that
    # stack (no lock wait on top) would be another fingerprint for the same hang
    threading.Event().wait()


def execute_model(step: dict[str, Any], rank: int, runner: Any = None) -> None:
    """One step of one model runner; `runner` (torch_device.DeviceRunner) when torch drives a GPU."""
    if step.get("hang_rank") == rank:
        if runner is not None and runner.world > 1:
            runner.lost_all_reduce()
        sample_tokens_stuck()
    if runner is not None:
        runner.step()
    if step["step_s"] > 0:
        time.sleep(step["step_s"])


READY = "READY"  # a worker's first message: named, logging, in its loop
WORKER_READY_TIMEOUT_S = 120.0  # generous: two busy cores fork TP workers slowly


# vLLM's own names for a worker's loop and entry point (WorkerProc.worker_busy_loop, worker_main): a
# hang's fingerprint leaves them out, so one stuck step is one finding at every TP size.
def worker_busy_loop(inbox: Any, outbox: Any, rank: int, runner: Any = None) -> None:
    while True:
        try:
            step = inbox.recv()
        except (EOFError, OSError):
            return
        if step is None:
            return
        execute_model(step, rank, runner)
        try:
            outbox.send(rank)
        except (BrokenPipeError, OSError):
            return


def worker_main(
    inbox: Any, outbox: Any, rank: int, config: SimConfig, parent_pid: int, store: str | None = None
) -> None:
    set_process_title(f"VLLM::Worker_TP{rank}")
    die_with_parent(parent_pid)
    reset_child_signals()
    setup_process_logging(f"Worker_TP{rank}")
    vlog(
        logging.INFO,
        "parallel_state.py:1325",
        "rank %d in world size %d is assigned as DP rank 0, PP rank 0, TP rank %d, EP rank %d",
        rank,
        config.flags["tp"],
        rank,
        rank,
    )
    # torch imported, the device and the workers' group set up before READY, as vLLM's workers load
    # their model first: the engine is up only once every runner can step
    make_runner = device_runner(config, rank, store)
    runner = make_runner() if make_runner is not None else None
    try:
        outbox.send(READY)
    except (BrokenPipeError, OSError):
        os._exit(0)
    worker_busy_loop(inbox, outbox, rank, runner)
    os._exit(0)


def gloo_rendezvous() -> str:
    """Where the workers' gloo group meets: a loopback TCP store rank 0 serves (gone with the workers,
    where a file store would outlive a killed engine)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def device_runner(config: SimConfig, rank: int, store: str | None) -> Callable[[], Any] | None:
    """What makes a model runner's torch side (`--torch-device`), or None for the simulated GPU."""
    if not config.torch_device:
        return None
    from .torch_device import DeviceRunner

    tp = int(config.flags["tp"])
    return partial(DeviceRunner, config.torch_device, rank, tp, store)


class Executor:
    def __init__(self, config: SimConfig, clocks: Clocks) -> None:
        import multiprocessing as mp

        self.tp = int(config.flags["tp"])
        self.clocks = clocks
        ctx = mp.get_context("fork")
        store = gloo_rendezvous() if config.torch_device and self.tp > 1 else None
        writers, readers = [], []
        self.procs: list[Any] = []
        self.threads: list[threading.Thread] = []
        for rank in range(self.tp):
            in_r, in_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            writers.append(in_w)
            readers.append(out_r)
            if self.tp == 1:
                make_runner = device_runner(config, rank, None)  # TP 1: torch in the engine core itself
                runner = make_runner() if make_runner is not None else None
                t = threading.Thread(
                    target=worker_busy_loop, args=(in_r, out_w, rank, runner), name="model-runner", daemon=True
                )
                t.start()
                self.threads.append(t)
            else:
                extra = (store,) if store else ()
                p = ctx.Process(
                    target=worker_main,
                    args=(in_r, out_w, rank, config, os.getpid(), *extra),
                    name=f"Worker_TP{rank}",
                    daemon=False,
                )
                p.start()
                in_r.close()
                out_w.close()
                self.procs.append(p)
        # as vLLM's MultiprocExecutor waits for each WorkerProc's READY: the engine (and /health) is up
        # only once every worker has its name and its loop (TP 1: a thread here, no process to wait for)
        for rank, (reader, proc) in enumerate(zip(readers, self.procs, strict=False)):
            try:
                ready = reader.poll(WORKER_READY_TIMEOUT_S) and reader.recv() == READY
            except (EOFError, OSError):  # its end of the pipe closed: the worker died first
                proc.join(timeout=2)
                self.shutdown()
                raise RuntimeError(
                    f"Worker_TP{rank} (pid {proc.pid}) exited with code {proc.exitcode} before it became ready"
                ) from None
            if not ready:
                self.shutdown()
                raise RuntimeError(
                    f"Worker_TP{rank} (pid {proc.pid}) did not become ready in {WORKER_READY_TIMEOUT_S:.0f} s"
                )
        self.mq = MessageQueue(writers, readers, clocks.ring_warning_s, int(clocks.ring_warning_nominal))
        self.hang_rank: int | None = None
        self.crash_next = False

    def execute_model(self, step_s: float) -> None:
        if self.crash_next:
            raise RuntimeError(
                "CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
            )
        msg = {"step_s": step_s}
        if self.hang_rank is not None:
            msg["hang_rank"] = self.hang_rank
        self.mq.enqueue(msg)

    def sample_tokens(self, step_s: float) -> list[Any]:
        # Only a planted hang runs on the scaled clocks: a worker that is merely slow (two busy cores,
        # a long prefill) waits on vLLM's real ones, so the simulator never invents a hang of its own.
        planted = self.hang_rank is not None
        timeout = self.clocks.rpc_timeout_s if planted else self.clocks.rpc_timeout_nominal
        warning = self.clocks.ring_warning_s if planted else self.clocks.ring_warning_nominal
        try:
            return self.mq.dequeue(step_s, timeout, warning)
        except TimeoutError as exc:
            raise TimeoutError("RPC call to sample_tokens timed out.") from exc

    def shutdown(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=2)
