"""The simulated engine's API server: vLLM's OpenAI-compatible HTTP API, /metrics and stats line.

This process is the one a soak job launches (like `vllm serve`'s API server). It forks the engine
core (`core.py`), feeds it requests over a multiprocessing queue and turns its step outputs into
HTTP responses, Prometheus metrics (vLLM's names, `prometheus_client`) and the periodic stats line.
Everything it reports about the engine comes from the engine core's last step, so when the core
hangs, `/metrics` and the stats line freeze exactly as vLLM's do while `/health` stays 200; when the
core dies, `/health` answers 503, requests fail with 500, and after the first failed request the
server exits with code 1 (vLLM's `terminate_if_errored`; `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1` keeps it up).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
import zlib
from collections import deque
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from .args import SimConfig
from .core import VLLM_VERSION, Clocks, run_engine_core
from .proc import plain_log, setup_process_logging, vlog
from .text import chat_ids, detokenize, prompt_ids

DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
STARTUP_TIMEOUT_S = 120.0


class EngineDeadError(Exception):
    """vLLM's `vllm.v1.engine.exceptions.EngineDeadError` (same printed name in tracebacks)."""


EngineDeadError.__module__ = "vllm.v1.engine.exceptions"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


# ----------------------------------------------------------------------------------------------
# metrics and the stats line


class Metrics:
    """vLLM 0.33's Prometheus metrics (names, types, labels `model_name` and `engine`)."""

    def __init__(self, model_name: str, spec: bool) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": "0"}

        def g(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(**values)

        def c(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**values)

        def h(name: str, doc: str, buckets: list[float]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**values)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = c("vllm:prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                labels + ["finished_reason"], registry=r)
        for reason in ("stop", "length", "abort"):
            self._success.labels(finished_reason=reason, **values)
        self._values = values
        self.iteration_tokens = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                  [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                     [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                      10.0, 20.0, 40.0, 80.0])
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                      120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0])
        token_buckets = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
        self.request_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.request_generation = h("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                    token_buckets)
        self.spec = spec
        if spec:
            self.spec_drafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_draft_tokens = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_accepted = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            self._spec_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted tokens per draft position.", labels + ["position"], registry=r)

    def success(self, reason: str) -> None:
        self._success.labels(finished_reason=reason, **self._values).inc()

    def spec_pos(self, pos: int, n: int) -> None:
        self._spec_pos.labels(position=str(pos), **self._values).inc(n)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class StatLogger:
    """vLLM's `LoggingStatLogger`: the `Engine 000: Avg prompt throughput: ...` line."""

    def __init__(self) -> None:
        self.num_prompt = 0
        self.num_generation = 0
        self.num_preemptions = 0
        self.last_log = time.monotonic()
        self.last_prompt_tp = 0.0
        self.last_generation_tp = 0.0
        self.running = 0
        self.waiting = 0
        self.kv = 0.0
        self.prefix: deque[tuple[int, int, int]] = deque()   # (requests, queries, hits), last 1000 requests
        self.prefix_totals = [0, 0, 0]
        self.spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_pos": []}

    def observe(self, step: dict[str, Any]) -> None:
        self.num_prompt += step["prompt_tokens"]
        self.num_generation += step["gen_tokens"]
        self.num_preemptions += step["preempted"]
        self.running, self.waiting, self.kv = step["running"], step["waiting"], step["kv"]
        if step["prefix_requests"]:
            entry = (step["prefix_requests"], step["prefix_queries"], step["prefix_hits"])
            self.prefix.append(entry)
            for i in range(3):
                self.prefix_totals[i] += entry[i]
            while self.prefix_totals[0] > 1000 and len(self.prefix) > 1:
                old = self.prefix.popleft()
                for i in range(3):
                    self.prefix_totals[i] -= old[i]
        spec = step.get("spec")
        if spec:
            for key in ("drafts", "draft_tokens", "accepted"):
                self.spec[key] += spec[key]
            pos = self.spec["accepted_pos"]
            pos.extend([0] * (len(spec["accepted_pos"]) - len(pos)))
            for i, n in enumerate(spec["accepted_pos"]):
                pos[i] += n

    def hit_rate(self) -> float:
        q = self.prefix_totals[1]
        return self.prefix_totals[2] / q if q else 0.0

    def log(self) -> None:
        now = time.monotonic()
        elapsed = max(1e-9, now - self.last_log)
        prompt_tp = self.num_prompt / elapsed
        generation_tp = self.num_generation / elapsed
        idle = not any((prompt_tp, generation_tp, self.last_prompt_tp, self.last_generation_tp))
        level = logging.DEBUG if idle else logging.INFO
        self.last_prompt_tp, self.last_generation_tp = prompt_tp, generation_tp
        parts = ["Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s",
                 "Running: %d reqs", "Waiting: %d reqs"]
        args: list[Any] = [prompt_tp, generation_tp, self.running, self.waiting]
        if self.num_preemptions > 0:
            parts.append("Preemptions: %d")
            args.append(self.num_preemptions)
        parts += ["GPU KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%"]
        args += [self.kv * 100, self.hit_rate() * 100]
        vlog(level, "loggers.py:257", "Engine 000: " + ", ".join(parts), *args)
        s = self.spec
        if s["drafts"]:
            rates = ", ".join(f"{n / s['drafts']:.3f}" for n in s["accepted_pos"])
            vlog(level, "metrics.py:96",
                 "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
                 "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
                 "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
                 1 + s["accepted"] / s["drafts"], s["accepted"] / elapsed, s["draft_tokens"] / elapsed,
                 s["accepted"], s["draft_tokens"], rates,
                 100.0 * s["accepted"] / s["draft_tokens"] if s["draft_tokens"] else 0.0)
        self.num_prompt = self.num_generation = self.num_preemptions = 0
        self.spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_pos": []}
        self.last_log = now


# ----------------------------------------------------------------------------------------------
# the engine client: the engine-core process and its queues


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


def _core_entry(config: SimConfig, inbox: Any, outbox: Any, close: tuple[socket.socket, ...],
                parent_pid: int) -> None:
    for sock in close:      # the API server's listening socket is not the engine core's to hold
        sock.close()
    run_engine_core(config, inbox, outbox, parent_pid)


class EngineClient:
    def __init__(self, config: SimConfig, metrics: Metrics, stats: StatLogger,
                 close_in_core: tuple[socket.socket, ...] = ()) -> None:
        import multiprocessing as mp

        self.config = config
        self.metrics = metrics
        self.stats = stats
        ctx = mp.get_context("fork")
        self.inbox = ctx.Queue()
        self.outbox = ctx.Queue()
        self.proc = ctx.Process(target=_core_entry, args=(config, self.inbox, self.outbox, close_in_core, os.getpid()),
                                name="EngineCore_DP0", daemon=False)
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
        vlog(logging.ERROR, "core_client.py:564", "Engine core initialization failed. See root cause above. "
             "Failed core proc(s): {'EngineCore_DP0': %s}", self.proc.exitcode)
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
            except RuntimeError:   # loop closed
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
        vlog(logging.ERROR, "core_client.py:564",
             "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
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


# ----------------------------------------------------------------------------------------------
# HTTP


class UvicornAccessLogger(AbstractAccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        plain_log('%s - "%s %s HTTP/%d.%d" %d %s', where, request.method, request.path_qs,
                  request.version.major, request.version.minor, response.status, response.reason)


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        text=_dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}))


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class SimServer:
    def __init__(self, config: SimConfig, client: EngineClient) -> None:
        self.config = config
        self.client = client
        self.created = int(time.time())
        self.exit_code = 0
        self.stop = asyncio.Event()
        self.keep_alive_on_death = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") not in ("", "0", "false")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    # -- engine death -> shut down after a failed request (vLLM's terminate_if_errored)
    def request_failed(self) -> None:
        if self.keep_alive_on_death:
            return
        self.exit_code = 1
        asyncio.get_running_loop().call_later(1.0, self.stop.set)

    async def health(self, request: web.Request) -> web.Response:
        if self.client.dead is not None:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        c = self.config
        card = {"id": c.model_name, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": c.model, "parent": None, "max_model_len": c.max_model_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}
        return web.Response(content_type="application/json", text=_dumps({"object": "list", "data": [card]}))

    async def metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return web.Response(body=self.client.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- generation
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("Request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object")
        model = body.get("model")
        if model not in (None, self.config.model_name, self.config.model):
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        n = body.get("n", 1)
        if n not in (1, None):
            raise BadRequest("the simulated engine supports n=1 only")
        return body

    def _max_tokens(self, body: dict[str, Any], prompt_len: int, default: int | None,
                    prompt: list[int]) -> tuple[int, bool]:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
        natural = False
        if value is None:
            if default is not None:
                value = default
            else:   # chat without a limit: the model "stops" by itself, deterministically
                rng = random.Random(f"len:{self.config.seed}:{zlib.crc32(repr(prompt).encode())}")
                value, natural = rng.randint(16, 256), True
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {value}.")
        limit = self.config.max_model_len
        if prompt_len + value > limit:
            if natural:
                value = max(1, limit - prompt_len)
            else:
                raise BadRequest(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{prompt_len + value} tokens ({prompt_len} in the messages, {value} in the completion). "
                    "Please reduce the length of the messages or completion.")
        if prompt_len >= limit:
            raise BadRequest(f"The prompt (total length {prompt_len}) is too long to fit into the model "
                             f"(context length {limit}). Make sure that `max_model_len` is no smaller than the "
                             "number of text tokens plus multimodal tokens.")
        return value, natural

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            try:
                ids = prompt_ids(prompt)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            max_tokens, natural = self._max_tokens(body, len(ids), 16, ids)
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        return await self._generate(request, body, ids, max_tokens, natural, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            try:
                ids = chat_ids(body.get("messages"))
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            max_tokens, natural = self._max_tokens(body, len(ids), None, ids)
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        return await self._generate(request, body, ids, max_tokens, natural, chat=True)

    async def _generate(self, request: web.Request, body: dict[str, Any], ids: list[int], max_tokens: int,
                        natural: bool, chat: bool) -> web.StreamResponse:
        client = self.client
        req_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if client.dead is not None:
            self.request_failed()
            return _error(500, DEAD_MESSAGE, "InternalServerError")
        state = client.add(req_id, ids, max_tokens, body.get("seed"), natural)
        created = int(time.time())
        model = self.config.model_name
        stream = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
        finished = False
        try:
            if not stream:
                tokens: list[int] = []
                finish = None
                while finish is None:
                    item = await state.queue.get()
                    if isinstance(item, Exception):
                        self.request_failed()
                        return _error(500, DEAD_MESSAGE, "InternalServerError")
                    tokens.extend(item[0])
                    finish = item[1]
                finished = True
                usage = {"prompt_tokens": len(ids), "total_tokens": len(ids) + len(tokens),
                         "completion_tokens": len(tokens), "prompt_tokens_details": None}
                text = detokenize(tokens)
                if chat:
                    choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                                      "annotations": None, "audio": None, "function_call": None,
                                                      "tool_calls": [], "reasoning_content": None},
                              "logprobs": None, "finish_reason": finish, "stop_reason": None}
                    out = {"id": req_id, "object": "chat.completion", "created": created, "model": model,
                           "choices": [choice], "service_tier": None, "system_fingerprint": None,
                           "usage": usage, "prompt_logprobs": None, "kv_transfer_params": None}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                              "stop_reason": None, "prompt_logprobs": None}
                    out = {"id": req_id, "object": "text_completion", "created": created, "model": model,
                           "choices": [choice], "service_tier": None, "system_fingerprint": None,
                           "usage": usage, "kv_transfer_params": None}
                return web.Response(content_type="application/json", text=_dumps(out))

            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                           "Cache-Control": "no-cache"})
            await resp.prepare(request)
            obj = "chat.completion.chunk" if chat else "text_completion"
            if chat:
                first = {"id": req_id, "object": obj, "created": created, "model": model,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}]}
                await resp.write(f"data: {_dumps(first)}\n\n".encode())
            total = 0
            finish = None
            while finish is None:
                item = await state.queue.get()
                while not isinstance(item, Exception) and item[1] is None and not state.queue.empty():
                    nxt = state.queue.get_nowait()      # a slow reader gets the steps merged, as in vLLM
                    if isinstance(nxt, Exception):
                        item = nxt
                        break
                    item = (item[0] + nxt[0], nxt[1])
                if isinstance(item, Exception):
                    err = {"error": {"message": DEAD_MESSAGE, "type": "InternalServerError", "param": None,
                                     "code": 500}}
                    await resp.write(f"data: {_dumps(err)}\n\ndata: [DONE]\n\n".encode())
                    self.request_failed()
                    return resp
                tokens, finish = item
                total += len(tokens)
                text = detokenize(tokens)
                if chat:
                    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
                    if finish is not None:
                        choice["stop_reason"] = None
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                              "stop_reason": None}
                chunk = {"id": req_id, "object": obj, "created": created, "model": model, "choices": [choice]}
                if not chat:
                    chunk["usage"] = None
                await resp.write(f"data: {_dumps(chunk)}\n\n".encode())
            finished = True
            if include_usage:
                usage = {"prompt_tokens": len(ids), "total_tokens": len(ids) + total, "completion_tokens": total}
                chunk = {"id": req_id, "object": obj, "created": created, "model": model, "choices": [],
                         "usage": usage}
                await resp.write(f"data: {_dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            if not finished:
                client.abort(req_id)


# ----------------------------------------------------------------------------------------------
# the process


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def serve(config: SimConfig) -> int:
    """Run the API server (and its engine core) until SIGTERM/SIGINT or engine death; the exit code."""
    setup_process_logging("APIServer")
    vlog(logging.INFO, "api_server.py:1880", "vLLM API server version %s", VLLM_VERSION)
    vlog(logging.INFO, "utils.py:253", "non-default args: %s",
         {"model_tag": config.model, "host": config.host, "port": config.port,
          **{k: v for k, v in config.flags.items() if k in config.explicit}})
    for note in config.notes:
        vlog(logging.WARNING, "sim_args.py:1", "soakmatrix sim-engine: ignoring %s (not modelled)", note)
    try:
        sock = _bind(config.host, config.port)
    except OSError as exc:
        vlog(logging.ERROR, "api_server.py:1931", "%s: could not bind %s:%d", exc, config.host, config.port)
        return 1
    clocks = Clocks.from_env(config.time_scale)
    metrics = Metrics(config.model_name, spec=bool(config.spec_tokens))
    stats = StatLogger()
    client = EngineClient(config, metrics, stats, close_in_core=(sock,))
    if not client.start():
        sock.close()
        return 1
    try:
        return asyncio.run(_serve_async(config, client, sock, clocks))
    finally:
        client.shutdown()


async def _serve_async(config: SimConfig, client: EngineClient, sock: socket.socket, clocks: Clocks) -> int:
    loop = asyncio.get_running_loop()
    server = SimServer(config, client)
    client.attach(loop)
    runner = web.AppRunner(server.app(), handle_signals=False, shutdown_timeout=1.0,
                           access_log_class=UvicornAccessLogger,
                           access_log=logging.getLogger("soakmatrix.sim.plain") if config.access_log else None)
    await runner.setup()
    site = web.SockSite(runner, sock, shutdown_timeout=1.0)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop.set)
    vlog(logging.INFO, "api_server.py:1971", "Starting vLLM API server 0 on http://%s:%d", config.host, config.port)
    await site.start()
    pid = os.getpid()
    plain_log("Started server process [%d]", pid)
    plain_log("Waiting for application startup.")
    plain_log("Application startup complete.")

    async def log_stats() -> None:
        while client.dead is None:
            await asyncio.sleep(clocks.stats_interval_s)
            if client.dead is None and config.log_stats:
                client.stats.log()

    stats_task = loop.create_task(log_stats())
    await server.stop.wait()
    plain_log("Shutting down")
    stats_task.cancel()
    client.shutting_down = True
    await runner.cleanup()
    plain_log("Waiting for application shutdown.")
    plain_log("Application shutdown complete.")
    plain_log("Finished server process [%d]", pid)
    if client.dead is not None and server.exit_code == 0 and not server.keep_alive_on_death:
        server.exit_code = 1
    return server.exit_code
