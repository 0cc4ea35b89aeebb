"""The simulated API server's engine client: the forked engine-core process, its queues, the requests.

`EngineClient` forks the engine core (`core.py`), sends it requests and aborts over a
multiprocessing queue, and turns each step's outputs into tokens on each request's asyncio queue
(read by the HTTP handlers, `api.py`) and into metrics and the stats line (`metrics.py`). When the
core dies (its last word, or its process exiting), every request in flight gets vLLM's
`EngineDeadError`, logged as vLLM's output handler logs it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any

from .args import SimConfig
from .core import run_engine_core
from .metrics import Metrics, StatLogger
from .proc import vlog

DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
STARTUP_TIMEOUT_S = 120.0


class EngineDeadError(Exception):
    """vLLM's `vllm.v1.engine.exceptions.EngineDeadError` (same printed name in tracebacks)."""


EngineDeadError.__module__ = "vllm.v1.engine.exceptions"


class RequestState:
    __slots__ = ("queue", "arrival", "first_token", "last_token", "tokens", "prompt_len", "natural_stop")

    def __init__(self, prompt_len: int, natural_stop: bool) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrival = time.monotonic()
        self.first_token: float | None = None
        self.last_token = 0.0
        self.tokens = 0
        self.prompt_len = prompt_len
        self.natural_stop = natural_stop


def _core_entry(config: SimConfig, inbox: Any, outbox: Any, close: tuple[socket.socket, ...], parent_pid: int) -> None:
    for sock in close:  # the API server's listening socket is not the engine core's to hold
        sock.close()
    run_engine_core(config, inbox, outbox, parent_pid)


class EngineClient:
    def __init__(
        self, config: SimConfig, metrics: Metrics, stats: StatLogger, close_in_core: tuple[socket.socket, ...] = ()
    ) -> None:
        import multiprocessing as mp

        self.config = config
        self.metrics = metrics
        self.stats = stats
        ctx = mp.get_context("fork")
        self.inbox = ctx.Queue()
        self.outbox = ctx.Queue()
        self.proc = ctx.Process(
            target=_core_entry,
            args=(config, self.inbox, self.outbox, close_in_core, os.getpid()),
            name="EngineCore_DP0",
            daemon=False,
        )
        self.requests: dict[str, RequestState] = {}
        self.dead: str | None = None
        self.shutting_down = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.on_dead: list[Any] = []

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> bool:
        import queue as _q

        self.proc.start()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = self.outbox.get(timeout=0.1)
            except _q.Empty:
                if not self.proc.is_alive():
                    break
                continue
            if msg[0] == "ready":
                return True
            if msg[0] == "dead":
                break
        vlog(
            logging.ERROR,
            "core_client.py:564",
            "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': %s}",
            self.proc.exitcode,
        )
        self.shutdown()
        return False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        threading.Thread(target=self._read_outputs, name="output-reader", daemon=True).start()
        threading.Thread(target=self._watch_core, name="core-monitor", daemon=True).start()

    def _read_outputs(self) -> None:
        assert self.loop is not None
        while True:
            try:
                msg = self.outbox.get()
            except (EOFError, OSError):
                return
            try:
                self.loop.call_soon_threadsafe(self._on_message, msg)
            except RuntimeError:  # loop closed
                return

    def _watch_core(self) -> None:
        from multiprocessing.connection import wait

        wait([self.proc.sentinel])
        if self.loop is not None and not self.shutting_down:
            try:
                self.loop.call_soon_threadsafe(self._core_exited)
            except RuntimeError:
                pass

    def _core_exited(self) -> None:
        if self.shutting_down or self.dead is not None:
            return
        # the reader thread may still deliver the core's last words; give it a moment
        assert self.loop is not None
        self.loop.call_later(0.2, self._core_gone)

    def _core_gone(self) -> None:
        if self.shutting_down or self.dead is not None:
            return
        vlog(
            logging.ERROR,
            "core_client.py:564",
            "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        )
        self._mark_dead(f"engine core exited with code {self.proc.exitcode}")

    def _on_message(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "out":
            self._on_step(msg[1])
        elif kind == "dead":
            self._mark_dead(msg[1])

    def _mark_dead(self, reason: str) -> None:
        if self.dead is not None:
            return
        self.dead = reason
        try:
            raise EngineDeadError(DEAD_MESSAGE)
        except EngineDeadError:
            vlog(logging.ERROR, "async_llm.py:525", "AsyncLLM output_handler failed.", exc_info=True)
        for state in self.requests.values():
            state.queue.put_nowait(EngineDeadError(DEAD_MESSAGE))
        self.requests.clear()
        for callback in self.on_dead:
            callback()

    def _on_step(self, step: dict[str, Any]) -> None:
        now = time.monotonic()
        m = self.metrics
        m.running.set(step["running"])
        m.waiting.set(step["waiting"])
        m.kv_usage.set(step["kv"])
        if step["prompt_tokens"]:
            m.prompt_tokens.inc(step["prompt_tokens"])
        if step["gen_tokens"]:
            m.generation_tokens.inc(step["gen_tokens"])
        if step["preempted"]:
            m.preemptions.inc(step["preempted"])
        if step["prefix_queries"]:
            m.prefix_queries.inc(step["prefix_queries"])
            m.prefix_hits.inc(step["prefix_hits"])
        if step["iter_tokens"]:
            m.iteration_tokens.observe(step["iter_tokens"])
        spec = step.get("spec")
        if spec and m.spec and spec["drafts"]:
            m.spec_drafts.inc(spec["drafts"])
            m.spec_draft_tokens.inc(spec["draft_tokens"])
            m.spec_accepted.inc(spec["accepted"])
            for pos, n in enumerate(spec["accepted_pos"]):
                if n:
                    m.spec_pos(pos, n)
        self.stats.observe(step)
        for req_id, tokens, finish in step["outputs"]:
            state = self.requests.get(req_id)
            if state is None:
                continue
            if state.first_token is None:
                state.first_token = now
                m.ttft.observe(now - state.arrival)
            else:
                m.itl.observe(now - state.last_token)
            state.last_token = now
            state.tokens += len(tokens)
            if finish is not None:
                if state.natural_stop:
                    finish = "stop"
                del self.requests[req_id]
                m.success(finish)
                m.e2e.observe(now - state.arrival)
                m.request_prompt.observe(state.prompt_len)
                m.request_generation.observe(state.tokens)
            state.queue.put_nowait((tokens, finish))

    def add(self, req_id: str, prompt: list[int], max_tokens: int, seed: Any, natural_stop: bool) -> RequestState:
        if self.dead is not None:
            raise EngineDeadError(DEAD_MESSAGE)
        state = RequestState(len(prompt), natural_stop)
        self.requests[req_id] = state
        self.inbox.put(("add", req_id, prompt, max_tokens, seed))
        return state

    def abort(self, req_id: str) -> None:
        if self.requests.pop(req_id, None) is not None and self.dead is None:
            self.inbox.put(("abort", req_id))
            self.metrics.success("abort")

    def shutdown(self) -> None:
        self.shutting_down = True
        if self.proc.pid is None:
            return
        if self.proc.is_alive():
            try:
                self.inbox.put(("shutdown",))
            except (OSError, ValueError):
                pass
            self.proc.join(timeout=1.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2.0)
