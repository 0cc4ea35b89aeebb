"""The load driver's ceiling: how many concurrent streams and tokens/s one core of driver sustains.

A minimal streaming server (its own process, pinned to another core where there is one) emits one
token per stream every `--step-ms`; the driver (pinned to one core) runs a closed loop at each
concurrency. If the driver keeps up, tokens/s is concurrency x 1000/step-ms; where it falls behind,
or its CPU reaches 100 %, is its ceiling. On a busy machine the server starves first, so the table
also gives the driver's CPU cost per token and the ceiling it implies (1 s of one core / that cost). The soak's own load must stay well under it, so a soak
measures the engine, never the client.

    python -m benchmarks.bench_load            # concurrency 16 .. 1024, 10 s each
    python -m benchmarks.bench_load --quick    # 16 and 128, 4 s each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Sequence

import psutil

from soakmatrix.jobs.server_process import free_port


def serve(port: int, step_s: float) -> None:
    """The token server: every step, one SSE chunk to every open stream (no model, no batching cost)."""
    from aiohttp import web

    streams: set[asyncio.Queue] = set()

    async def ticker(_app: web.Application) -> None:
        async def run() -> None:
            while True:
                for q in list(streams):
                    q.put_nowait(1)
                await asyncio.sleep(step_s)
        asyncio.get_running_loop().create_task(run())

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "bench"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        q: asyncio.Queue = asyncio.Queue()
        streams.add(q)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(n):
                await q.get()
                await resp.write(b'data: {"choices": [{"text": " tok"}]}\n\n')
            await resp.write(b'data: {"choices": [], "usage": {"completion_tokens": %d}}\n\ndata: [DONE]\n\n' % n)
        finally:
            streams.discard(q)
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.on_startup.append(ticker)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def pin(pid: int, core: int) -> None:
    cores = os.sched_getaffinity(0)
    if len(cores) > 1:
        os.sched_setaffinity(pid, {sorted(cores)[core % len(cores)]})


def measure(url: str, concurrency: int, seconds: float, output_len: int) -> dict:
    from soakmatrix.jobs.load import LoadDriver
    from soakmatrix.matrix.contracts.workloads import Workload, params_of

    params = {**{k: d for k, (_, d) in params_of("random").items()}, "concurrency": concurrency,
              "input_len": [8, 16], "output_len": [output_len, output_len]}
    me = psutil.Process()
    cpu0, t0 = me.cpu_times(), time.monotonic()
    drv = LoadDriver(url, Workload("bench", "random", params), seed=0, duration_s=seconds, model="bench").start()
    time.sleep(seconds)
    snap = drv.snapshot()
    tokens = drv.stats.tokens
    wall = time.monotonic() - t0
    cpu1 = me.cpu_times()
    drv.stop(timeout_s=10)
    s = drv.stats.summary()
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {"concurrency": concurrency, "open": snap.open_streams, "tokens_per_s": tokens / wall,
            "cpu_us_per_token": 1e6 * cpu_s / tokens if tokens else None,
            "requests_per_s": s["completed"] / wall, "cpu_pct": 100 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / wall,
            "gap_p50_ms": 1000 * (s["gap_p50_s"] or 0), "gap_p99_ms": 1000 * (s["gap_p99_s"] or 0),
            "failed": s["failed"]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_load", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--concurrency", default="16,64,256,512,1024")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--step-ms", type=float, default=20.0, help="server: one token per stream every step")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--pin", action="store_true", help="pin the driver to core 0 and the server to core 1 "
                   "(only on an otherwise idle machine: on a busy one it starves both)")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.step_ms / 1000)
        return 0
    if args.quick:
        args.concurrency, args.seconds = "16,128", 4.0
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_load", "--serve", str(port),
                               "--step-ms", str(args.step_ms)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    rows = []
    try:
        if args.pin:
            pin(server.pid, 1)
            pin(0, 0)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"load driver (one Python thread: at most one core; CPU below is its share of one core); server emits a token per stream every {args.step_ms:.0f} ms "
              f"(ideal tokens/s = concurrency x {1000 / args.step_ms:.0f})\n")
        print(f"{'streams':>7} {'open':>5} {'tokens/s':>9} {'ideal':>7} {'req/s':>6} {'driver CPU':>10} "
              f"{'CPU us/token':>12} {'ceiling tok/s/core':>18} {'gap p50 ms':>10} {'gap p99 ms':>10}")
        for c in [int(x) for x in args.concurrency.split(",")]:
            r = measure(url, c, args.seconds, args.output_len)
            rows.append(r)
            print(f"{c:>7} {r['open']:>5} {r['tokens_per_s']:>9.0f} {c * 1000 / args.step_ms:>7.0f} "
                  f"{r['requests_per_s']:>6.1f} {r['cpu_pct']:>9.0f}% "
                  f"{r['cpu_us_per_token'] or 0:>12.0f} "
                  f"{(1e6 / r['cpu_us_per_token']) if r['cpu_us_per_token'] else 0:>18.0f} {r['gap_p50_ms']:>10.1f} "
                  f"{r['gap_p99_ms']:>10.1f}", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
