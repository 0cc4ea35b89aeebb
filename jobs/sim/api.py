"""The simulated API server's HTTP handlers: vLLM's OpenAI-compatible API and /metrics.

`/v1/completions` and `/v1/chat/completions` (streamed or not, as vLLM shapes them), `/health`,
`/ping`, `/version`, `/v1/models` and `/metrics`. Generation goes through the engine client
(`engine_client.py`). After engine death `/health` answers 503, requests fail with 500 (a stream
in flight ends with an error chunk), and the first failed request shuts the server down with exit
code 1 (vLLM's `terminate_if_errored`; `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1` keeps it up).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
import zlib
from typing import Any

from aiohttp import web

from .args import SimConfig
from .core import VLLM_VERSION
from .engine_client import DEAD_MESSAGE, EngineClient
from .text import chat_ids, detokenize, prompt_ids


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    return web.Response(
        status=status,
        content_type="application/json",
        text=_dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}),
    )


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
        card = {
            "id": c.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": c.model,
            "parent": None,
            "max_model_len": c.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
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

    def _max_tokens(
        self, body: dict[str, Any], prompt_len: int, default: int | None, prompt: list[int]
    ) -> tuple[int, bool]:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
        natural = False
        if value is None:
            if default is not None:
                value = default
            else:  # chat without a limit: the model "stops" by itself, deterministically
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
                    "Please reduce the length of the messages or completion."
                )
        if prompt_len >= limit:
            raise BadRequest(
                f"The prompt (total length {prompt_len}) is too long to fit into the model "
                f"(context length {limit}). Make sure that `max_model_len` is no smaller than the "
                "number of text tokens plus multimodal tokens."
            )
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

    async def _generate(
        self, request: web.Request, body: dict[str, Any], ids: list[int], max_tokens: int, natural: bool, chat: bool
    ) -> web.StreamResponse:
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
                usage = {
                    "prompt_tokens": len(ids),
                    "total_tokens": len(ids) + len(tokens),
                    "completion_tokens": len(tokens),
                    "prompt_tokens_details": None,
                }
                text = detokenize(tokens)
                if chat:
                    choice = {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                    out = {
                        "id": req_id,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [choice],
                        "service_tier": None,
                        "system_fingerprint": None,
                        "usage": usage,
                        "prompt_logprobs": None,
                        "kv_transfer_params": None,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                    out = {
                        "id": req_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [choice],
                        "service_tier": None,
                        "system_fingerprint": None,
                        "usage": usage,
                        "kv_transfer_params": None,
                    }
                return web.Response(content_type="application/json", text=_dumps(out))

            resp = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
            )
            await resp.prepare(request)
            obj = "chat.completion.chunk" if chat else "text_completion"
            if chat:
                first = {
                    "id": req_id,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                await resp.write(f"data: {_dumps(first)}\n\n".encode())
            total = 0
            finish = None
            while finish is None:
                item = await state.queue.get()
                while not isinstance(item, Exception) and item[1] is None and not state.queue.empty():
                    nxt = state.queue.get_nowait()  # a slow reader gets the steps merged, as in vLLM
                    if isinstance(nxt, Exception):
                        item = nxt
                        break
                    item = (item[0] + nxt[0], nxt[1])
                if isinstance(item, Exception):
                    err = {
                        "error": {"message": DEAD_MESSAGE, "type": "InternalServerError", "param": None, "code": 500}
                    }
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
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                chunk = {"id": req_id, "object": obj, "created": created, "model": model, "choices": [choice]}
                if not chat:
                    chunk["usage"] = None
                await resp.write(f"data: {_dumps(chunk)}\n\n".encode())
            finished = True
            if include_usage:
                usage = {"prompt_tokens": len(ids), "total_tokens": len(ids) + total, "completion_tokens": total}
                chunk = {"id": req_id, "object": obj, "created": created, "model": model, "choices": [], "usage": usage}
                await resp.write(f"data: {_dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            if not finished:
                client.abort(req_id)
