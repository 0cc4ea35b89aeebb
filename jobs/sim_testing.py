"""Helpers to run a simulated engine from tests and benchmarks: start it, load it, stop it cleanly.

`SimProcess` starts `soakmatrix sim-engine` as its own process group on a free loopback port,
captures its log to a file, waits for /health, and on exit SIGTERMs it and checks (psutil) that the
whole process tree is gone. `load()` drives it with bounded concurrent requests from aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import psutil


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimProcess:
    def __init__(self, args: Sequence[str], log_path: str | Path, model: str = "sim-model",
                 env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "soakmatrix.matrix.cli", "sim-engine", model, *args,
                     "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.tree: list[psutil.Process] = []

    def start(self, ready_timeout: float = 30.0) -> "SimProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        end = time.monotonic() + ready_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim-engine exited with {self.proc.returncode}:\n{self.log()}")
            if self.health() == 200:
                self.tree = self.processes()
                return self
            time.sleep(0.05)
        raise TimeoutError(f"sim-engine not ready after {ready_timeout} s:\n{self.log()}")

    def health(self, timeout: float = 2.0) -> int | None:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (OSError, ValueError):
            return None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of /metrics: `name` -> value (summed over label sets)."""
        _, text = self.get("/metrics")
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_part, _, value = line.rpartition(" ")
            name = name_part.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
        return out

    def processes(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, needle: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if needle in self.log():
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the API server; returns its exit code. Kills the group if it does not go."""
        if self.proc is None:
            return None
        tree = self.tree or self.processes()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        gone, alive = psutil.wait_procs([p for p in tree if p.pid != self.proc.pid], timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.leftover = alive
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "SimProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def _one(session: Any, url: str, body: dict[str, Any], stream: bool, timeout: float) -> dict[str, Any]:
    import aiohttp

    result: dict[str, Any] = {"status": None, "chunks": 0, "tokens": 0, "error": None}
    try:
        async with session.post(url, json={**body, "stream": stream},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            result["status"] = resp.status
            if not stream or resp.status != 200:
                data = await resp.json(content_type=None)
                result["tokens"] = (data.get("usage") or {}).get("completion_tokens", 0)
                return result
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    result["error"] = chunk["error"]
                    break
                if chunk.get("choices"):
                    result["chunks"] += 1
                if chunk.get("usage"):
                    result["tokens"] = chunk["usage"]["completion_tokens"]
    except (asyncio.TimeoutError, OSError, Exception) as exc:  # noqa: BLE001 - a load driver records
        result["error"] = repr(exc)
    return result


async def load_async(base_url: str, concurrency: int, duration_s: float, max_tokens: int = 32,
                     prompt_words: int = 64, stream: bool = True, request_timeout: float = 30.0,
                     max_requests: int = 100_000) -> list[dict[str, Any]]:
    """Closed-loop load: `concurrency` clients, each sending requests one after another until done."""
    import aiohttp

    url = base_url + "/v1/completions"
    results: list[dict[str, Any]] = []
    end = time.monotonic() + duration_s
    counter = iter(range(max_requests))

    async def client(i: int, session: Any) -> None:
        for n in counter:
            if time.monotonic() >= end:
                return
            prompt = " ".join(f"w{(i * 7919 + n * 31 + k) % 997}" for k in range(prompt_words))
            body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            r = await _one(session, url, body, stream, request_timeout)
            results.append(r)
            if r["status"] != 200 or r["error"]:
                return

    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(i, session) for i in range(concurrency)))
    return results


def load(base_url: str, concurrency: int, duration_s: float, **kw: Any) -> list[dict[str, Any]]:
    return asyncio.run(load_async(base_url, concurrency, duration_s, **kw))


def read_hang_records(path: str | Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError:
        return []
