"""A tiny OpenAI-compatible streaming server for the soak job's tests (not the simulated engine).

Deterministic and small on purpose: a step loop emits one token per step to every open request;
`--slow-prefill-s` makes a long prompt stall every stream for that long (a legitimate slow step);
`--freeze-after-s A --freeze-for-s B` freezes the whole server once for B s (a starved host: no
token, no /metrics answer), then it goes on; `--hang-after-s` stops the step loop (a silent stall: /health stays 200) and writes the true start
to `--hang-record`; `--hang-style shm` also prints vLLM's shm_broadcast/RPC-timeout lines, `exit`
dies with a traceback instead, `error` answers every request with a 500 (a dead engine behind a
living API server); `--child` adds a child process so the server is a process tree.
Run as a script (`python tests/fake_openai.py --port P`) or in-process with `serve_in_thread`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class Engine:
    def __init__(self, step_s: float = 0.02, slow_prefill_s: float = 0.0, slow_prompt_words: int = 400,
                 hang_after_s: float | None = None, hang_style: str = "silent", hang_record: str | None = None,
                 warn_every_s: float = 1.0, freeze_after_s: float | None = None, freeze_for_s: float = 0.0) -> None:
        self.step_s, self.slow_prefill_s, self.slow_prompt_words = step_s, slow_prefill_s, slow_prompt_words
        self.hang_after_s, self.hang_style, self.hang_record = hang_after_s, hang_style, hang_record
        self.warn_every_s = warn_every_s
        self.freeze_after_s, self.freeze_for_s = freeze_after_s, freeze_for_s
        self.models_delay_s = 0.0
        self.registry = CollectorRegistry()
        self.gen = Counter("vllm:generation_tokens", "generated", registry=self.registry)
        self.prompt = Counter("vllm:prompt_tokens", "prompt", registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", registry=self.registry)
        self.queues: dict[int, asyncio.Queue] = {}
        self.pending_prefill: list[int] = []
        self.first_load_at: float | None = None
        self.hung = False
        self.next_id = 0
        self.port = 0

    async def run(self) -> None:
        while True:
            if self.queues and self.first_load_at is None:
                self.first_load_at = time.monotonic()
            if (not self.hung and self.hang_after_s is not None and self.first_load_at is not None
                    and time.monotonic() - self.first_load_at >= self.hang_after_s and self.queues):
                self._hang()
            if (self.freeze_after_s is not None and self.first_load_at is not None
                    and time.monotonic() - self.first_load_at >= self.freeze_after_s):
                self.freeze_after_s = None
                time.sleep(self.freeze_for_s)   # blocks the event loop: the server answers nothing
            if self.hung:
                if self.hang_style == "error":
                    for q in list(self.queues.values()):
                        q.put_nowait(None)   # ends every open stream early
                await asyncio.sleep(self.warn_every_s)
                if self.hang_style == "shm":
                    print("INFO (EngineCore) [shm_broadcast.py:681] No available shared memory broadcast "
                          f"block found in {self.warn_every_s:.0f} seconds.", flush=True)
                continue
            if self.pending_prefill:
                self.pending_prefill.clear()
                await asyncio.sleep(self.slow_prefill_s)   # blocks every stream: a long prefill
            for q in list(self.queues.values()):
                q.put_nowait("tok ")
                self.gen.inc()
            self.running.set(len(self.queues))
            await asyncio.sleep(self.step_s)

    def _hang(self) -> None:
        self.hung = True
        began = time.time()
        if self.hang_record:
            with open(self.hang_record, "a") as f:
                f.write(json.dumps({"began_at": began, "signature": self.hang_style}) + "\n")
        if self.hang_style == "exit":
            print("Traceback (most recent call last):\n  File \"fake.py\", line 1, in step\n"
                  "RuntimeError: engine died", flush=True)
            os._exit(1)


def make_app(engine: Engine) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        await asyncio.sleep(engine.models_delay_s)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(engine.registry), content_type="text/plain")

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if engine.hung and engine.hang_style == "error":   # a dead engine behind a living API server
            return web.json_response({"error": "EngineDeadError"}, status=500)
        chat = request.path.endswith("chat/completions")
        prompt = " ".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
        words = len(prompt.split())
        engine.prompt.inc(words)
        n = int(body.get("max_tokens", 16))
        engine.next_id += 1
        rid = engine.next_id
        q: asyncio.Queue = asyncio.Queue()
        engine.queues[rid] = q
        if engine.slow_prefill_s and words >= engine.slow_prompt_words:
            engine.pending_prefill.append(rid)
        try:
            if not body.get("stream"):
                text = "".join([(await q.get()) or "" for _ in range(n)])
                choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                return web.json_response({"choices": [choice], "usage": {"completion_tokens": n}})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(n):
                piece = await q.get()
                if piece is None:
                    break
                choice = {"delta": {"content": piece}} if chat else {"text": piece}
                await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            usage = {"choices": [], "usage": {"completion_tokens": n}}
            await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            return resp
        finally:
            engine.queues.pop(rid, None)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)

    tasks: list[asyncio.Task] = []

    async def start_engine(app: web.Application) -> None:
        tasks.append(asyncio.create_task(engine.run()))

    app.on_startup.append(start_engine)
    return app


def serve_in_thread(port: int = 0, **engine_kw) -> tuple[Engine, threading.Event]:
    """Serve on 127.0.0.1:port (0: a port the OS picks, race-free; see `engine.port`) from a daemon
    thread; set the returned event to stop."""
    engine = Engine(**engine_kw)
    stop = threading.Event()
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            runner = web.AppRunner(make_app(engine))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            engine.port = runner.addresses[0][1]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await runner.cleanup()
        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return engine, stop


def foreign_models_server():
    """Another process's server on a port of its own (an `http.server` in a thread): answers
    `/v1/models` 200, as any vLLM would. For port races; call `.shutdown()` and `.server_close()`."""
    import http.server

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"object": "list", "data": [{"id": "someone-elses-model"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def start_fake(folder, *args: str, attempts: int = 3):
    """This script as a server process under the soak job's launcher, ready; a port taken between
    our pick and its bind (other test runs share the machine) is retried on a new port.
    Returns (RunningServer, StartupFailure | None)."""
    from soakmatrix.jobs import server_process as launcher

    for _ in range(attempts):
        port = launcher.free_port()
        server = launcher.launch_argv([sys.executable, __file__, "--port", str(port), *args], folder, port)
        failure = server.wait_ready(60)
        if not launcher.port_taken(failure):
            return server, failure
        server.stop(grace_s=2)
    return server, failure


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--slow-prefill-s", type=float, default=0.0)
    p.add_argument("--slow-prompt-words", type=int, default=400)
    p.add_argument("--hang-after-s", type=float)
    p.add_argument("--hang-style", choices=["silent", "shm", "exit", "error"], default="silent")
    p.add_argument("--hang-record")
    p.add_argument("--freeze-after-s", type=float)
    p.add_argument("--freeze-for-s", type=float, default=0.0)
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--child", action="store_true")
    p.add_argument("--models-delay-s", type=float, default=0.0)   # a slow model discovery
    args = p.parse_args(argv)   # a bad flag: argparse's usage error, exit code 2, like vLLM
    if args.child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    time.sleep(args.startup_s)
    engine = Engine(args.step_s, args.slow_prefill_s, args.slow_prompt_words, args.hang_after_s,
                    args.hang_style, args.hang_record, freeze_after_s=args.freeze_after_s,
                    freeze_for_s=args.freeze_for_s)
    engine.models_delay_s = args.models_delay_s
    print(f"INFO fake server on 127.0.0.1:{args.port}", flush=True)
    web.run_app(make_app(engine), host="127.0.0.1", port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
