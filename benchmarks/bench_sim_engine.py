"""What the simulated engine sustains on one core: requests/s and streamed tokens/s.

The server (API server, engine core and its model-runner thread) is pinned to CPU 0 and the load
generator to CPU 1, so the numbers are the simulator's and not the client's. For each concurrency
the closed-loop load streams completions for a fixed time; the table gives requests/s, streamed
tokens/s, SSE chunks/s, the median time to first token and the CPU the API server and engine core
used (100 % = one core). A soak's load should stay well under these ceilings, so that what a
detector sees is the engine's behaviour and not the simulator running out of CPU.

    python -m benchmarks.bench_sim_engine [--seconds 8] [--concurrency 8,64,256] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from soakmatrix.fixtures.sim_testing import SimProcess, load


def _pin(pids: list[int], cpu: int) -> None:
    for pid in pids:
        try:
            os.sched_setaffinity(pid, {cpu})
        except (OSError, AttributeError):
            pass


def measure(concurrency: int, seconds: float, max_tokens: int, extra: list[str], workdir: Path) -> dict:
    sp = SimProcess(["--max-num-seqs", "256", "--disable-uvicorn-access-log", *extra],
                    workdir / f"bench-{concurrency}.log").start()
    try:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
        server_cpu, client_cpu = cpus[0], cpus[-1]
        _pin([p.pid for p in sp.tree], server_cpu)
        _pin([os.getpid()], client_cpu)
        procs = {p.name(): psutil.Process(p.pid) for p in sp.tree[:2]}
        for p in procs.values():
            p.cpu_percent(None)
        load(sp.url, concurrency, 1.0, max_tokens=max_tokens)            # warm up
        for p in procs.values():
            p.cpu_percent(None)
        t0 = time.monotonic()
        results = load(sp.url, concurrency, seconds, max_tokens=max_tokens, request_timeout=60)
        elapsed = time.monotonic() - t0
        cpu = {name: p.cpu_percent(None) for name, p in procs.items()}
    finally:
        sp.stop()
    ok = [r for r in results if r["status"] == 200 and not r["error"]]
    return {
        "concurrency": concurrency,
        "requests_s": len(ok) / elapsed,
        "tokens_s": sum(r["tokens"] for r in ok) / elapsed,
        "chunks_s": sum(r["chunks"] for r in ok) / elapsed,
        "errors": len(results) - len(ok),
        "api_cpu": cpu.get("python", 0.0),
        "core_cpu": cpu.get("VLLM::EngineCore", 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", default="8,64,256")
    parser.add_argument("--max-tokens", type=int, default=64)
    args, _ = parser.parse_known_args(argv if argv is not None else sys.argv[1:])
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"sim engine on one core: streamed completions, {args.max_tokens} tokens each, "
          f"{args.seconds:.0f} s per level")
    print(f"{'concurrency':>11} {'req/s':>8} {'tokens/s':>9} {'chunks/s':>9} {'errors':>6} "
          f"{'API cpu%':>8} {'core cpu%':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("realistic step times (the simulated GPU is the limit)", []),
                             ("no GPU time (--step-time-scale 0: the simulator's own ceiling)",
                              ["--step-time-scale", "0"])):
            print(label)
            for c in levels:
                r = measure(c, args.seconds, args.max_tokens, extra, Path(tmp))
                print(f"{r['concurrency']:>11} {r['requests_s']:>8.1f} {r['tokens_s']:>9.0f} "
                      f"{r['chunks_s']:>9.0f} {r['errors']:>6} {r['api_cpu']:>8.0f} {r['core_cpu']:>9.0f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
