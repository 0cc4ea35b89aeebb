"""The simulated engine's API server process: what a soak job launches (like `vllm serve`).

`serve` binds the port, forks the engine core through the engine client (`engine_client.py`),
serves the HTTP API (`api.py`) with uvicorn-style access and lifecycle lines, writes the stats line
(`metrics.py`) every stats interval, and returns the exit code on SIGTERM/SIGINT or engine death.
Everything it reports about the engine comes from the engine core's last step, so when the core
hangs, `/metrics` and the stats line freeze exactly as vLLM's do while `/health` stays 200.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from .api import SimServer
from .args import SimConfig
from .clocks import Clocks
from .core import VLLM_VERSION
from .engine_client import EngineClient
from .metrics import Metrics, StatLogger
from .proc import plain_log, setup_process_logging, vlog


class UvicornAccessLogger(AbstractAccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        plain_log(
            '%s - "%s %s HTTP/%d.%d" %d %s',
            where,
            request.method,
            request.path_qs,
            request.version.major,
            request.version.minor,
            response.status,
            response.reason,
        )


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
    vlog(
        logging.INFO,
        "utils.py:253",
        "non-default args: %s",
        {
            "model_tag": config.model,
            "host": config.host,
            "port": config.port,
            **{k: v for k, v in config.flags.items() if k in config.explicit},
        },
    )
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
    runner = web.AppRunner(
        server.app(),
        handle_signals=False,
        shutdown_timeout=1.0,
        access_log_class=UvicornAccessLogger,
        access_log=logging.getLogger("soakmatrix.sim.plain") if config.access_log else None,
    )
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
