"""The load driver: seeded streaming requests against an OpenAI-compatible server, on its own thread.

`LoadDriver(base_url, workload, seed)` runs an asyncio loop with one aiohttp session in a background
thread: a closed loop (a target number of requests in flight, which the `ramp` kind moves) or an
open loop (Poisson or trickle arrivals), bounded by `max_requests`, a duration and
`request_timeout_s`. It records per-request time to first token and the gaps between tokens, and
exposes `snapshot()` (what the stream detector needs) and `stats` (totals for the result).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from soakmatrix.jobs.detect.protocol import StreamState
from soakmatrix.jobs.sse import DONE, data_payload
from soakmatrix.matrix.contracts.workloads import params_of

from .load_shapes import Arrivals, RequestSource, RequestSpec, is_open_loop, target_concurrency

SAMPLE_CAP = 20_000  # TTFTs and gaps kept for percentiles (a bounded window, newest kept)
MAX_OPEN_LOOP_IN_FLIGHT = 2048


@dataclass
class _Open:
    started: float
    prompt_len: int
    first_token_at: float | None = None
    last_token_at: float | None = None
    chunks: int = 0


@dataclass
class LoadStats:
    """Totals and samples; updated on the driver's thread, read anywhere under `lock`."""

    sent: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    started_at: float | None = None
    stopped_at: float | None = None
    last_token_at: float | None = None
    max_gap_s: float = 0.0
    consecutive_failures: int = 0
    last_error: str | None = None
    errors: dict[str, int] = field(default_factory=dict)
    ttft_s: deque = field(default_factory=lambda: deque(maxlen=SAMPLE_CAP))
    gaps_s: deque = field(default_factory=lambda: deque(maxlen=SAMPLE_CAP))
    open: dict[int, _Open] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def summary(self) -> dict[str, Any]:
        with self.lock:
            ttft, gaps = sorted(self.ttft_s), sorted(self.gaps_s)
            return {
                "sent": self.sent,
                "completed": self.completed,
                "failed": self.failed,
                "tokens": self.tokens,
                "in_flight": len(self.open),
                "errors": dict(self.errors),
                "ttft_p50_s": _pct(ttft, 0.5),
                "ttft_p99_s": _pct(ttft, 0.99),
                "gap_p50_s": _pct(gaps, 0.5),
                "gap_p99_s": _pct(gaps, 0.99),
                "gap_max_s": self.max_gap_s,
                "duration_s": ((self.stopped_at or time.time()) - self.started_at) if self.started_at else 0.0,
            }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


class LoadDriver:
    def __init__(
        self,
        base_url: str,
        workload: Any,
        seed: int = 0,
        *,
        duration_s: float | None = None,
        model: str | None = None,
        clock: Callable[[], float] = time.time,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """`workload` is a `matrix.spec.Workload` (or anything with `.kind` and `.params`)."""
        self.base_url = base_url.rstrip("/")
        self.kind = workload.kind
        self.params = {
            **{k: d for k, (_, d) in params_of(self.kind).items()},
            **dict(workload.params),
            **dict(params or {}),
        }
        self.seed = seed
        self.duration_s = duration_s
        self.model = model
        self.clock = clock
        self.stats = LoadStats()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._no_new = threading.Event()  # stop sending; let in-flight requests finish
        self._cancel = threading.Event()  # abandon in-flight requests too
        self._done = threading.Event()
        self._ids = 0

    # ------------------------------------------------------------ control (any thread)

    def start(self) -> LoadDriver:
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        self._thread.start()
        return self

    def stop_sending(self) -> None:
        self._no_new.set()

    def drain(self, timeout_s: float) -> bool:
        """Stop sending and wait for open requests to finish; True if they all did."""
        self._no_new.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.stats.lock:
                if not self.stats.open:
                    return True
            if self._done.wait(0.1):
                return True
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abandon everything and join the thread (bounded)."""
        self._no_new.set()
        self._cancel.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(lambda: None)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def snapshot(self) -> StreamState:
        now = self.clock()
        with self.stats.lock:
            waiting = [o for o in self.stats.open.values() if o.first_token_at is None]
            return StreamState(
                at=now,
                open_streams=len(self.stats.open),
                last_token_at=self.stats.last_token_at,
                oldest_waiting_first_token_since=min((o.started for o in waiting), default=None),
                waiting_first_token_prompt_len=max((o.prompt_len for o in waiting), default=0),
                tokens=self.stats.tokens,
                consecutive_failures=self.stats.consecutive_failures,
                last_error=self.stats.last_error,
            )

    def __enter__(self) -> LoadDriver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ the driver's thread

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except Exception as exc:  # noqa: BLE001 - the driver must never take the job down
            self._error(f"driver: {type(exc).__name__}: {exc}", counts_as_failure=False)
        finally:
            with self.stats.lock:
                self.stats.stopped_at = self.clock()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._done.set()

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=float(self.params["request_timeout_s"]), sock_connect=30)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            if self.model is None:
                self.model = await self._discover_model(session)
            source = RequestSource(self.kind, self.params, self.seed)
            with self.stats.lock:
                self.stats.started_at = self.clock()
            start = time.monotonic()
            tasks: set[asyncio.Task] = set()
            watcher = asyncio.create_task(self._watch_cancel(tasks))
            try:
                if is_open_loop(self.kind, self.params):
                    await self._open_loop(session, source, start, tasks)
                else:
                    await self._closed_loop(session, source, start, tasks)
                if tasks:
                    await asyncio.wait(tasks)
            finally:
                watcher.cancel()
                for t in tasks:
                    t.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=5)

    async def _watch_cancel(self, tasks: set[asyncio.Task]) -> None:
        # a threading.Event, set from the caller's thread: polled, since no awaitable can wait on it
        while not self._cancel.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for t in list(tasks):
            t.cancel()

    def _may_send(self, start: float) -> bool:
        if self._no_new.is_set() or self._cancel.is_set():
            return False
        if self.duration_s is not None and time.monotonic() - start >= self.duration_s:
            return False
        with self.stats.lock:
            return self.stats.sent < int(self.params["max_requests"])

    async def _closed_loop(
        self, session: aiohttp.ClientSession, source: RequestSource, start: float, tasks: set[asyncio.Task]
    ) -> None:
        while self._may_send(start):
            want = target_concurrency(self.kind, self.params, time.monotonic() - start)
            while len(tasks) < want and self._may_send(start):
                self._spawn(session, source, tasks)
            if tasks:
                done, _ = await asyncio.wait(tasks, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
                if any(t.cancelled() or t.exception() is not None or t.result() is False for t in done):
                    await asyncio.sleep(0.2)  # failing server: do not spin
            else:
                await asyncio.sleep(0.05)

    async def _open_loop(
        self, session: aiohttp.ClientSession, source: RequestSource, start: float, tasks: set[asyncio.Task]
    ) -> None:
        for at in Arrivals(self.kind, self.params, self.seed):
            # until the arrival time, unless another thread stops the load (threading.Events) first
            while self._may_send(start) and time.monotonic() - start < at:  # noqa: ASYNC110
                await asyncio.sleep(min(0.1, max(0.0, at - (time.monotonic() - start))))
            if not self._may_send(start):
                return
            if len(tasks) < MAX_OPEN_LOOP_IN_FLIGHT:
                self._spawn(session, source, tasks)

    def _spawn(self, session: aiohttp.ClientSession, source: RequestSource, tasks: set[asyncio.Task]) -> None:
        spec = source.next()
        with self.stats.lock:
            self.stats.sent += 1
        task = asyncio.create_task(self._request(session, source, spec))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _discover_model(self, session: aiohttp.ClientSession) -> str:
        try:
            async with session.get(f"{self.base_url}/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as r:
                data = await r.json(content_type=None)
                return data["data"][0]["id"]
        except Exception as exc:  # noqa: BLE001 - whatever /v1/models answers (or not), the load goes on
            self._error(f"models: {type(exc).__name__}", counts_as_failure=False)
            return "default"

    async def _request(self, session: aiohttp.ClientSession, source: RequestSource, spec: RequestSpec) -> bool:
        stream = bool(self.params.get("stream", True))
        path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        self._ids += 1
        rid = self._ids
        entry = _Open(started=self.clock(), prompt_len=spec.input_len)
        with self.stats.lock:
            self.stats.open[rid] = entry
        text: list[str] = []
        ok = False
        try:
            async with session.post(self.base_url + path, json=spec.body(self.model or "default", stream)) as r:
                if r.status != 200:
                    self._error(f"http {r.status}")
                    await r.read()
                    return False
                if stream:
                    usage_tokens = await self._read_stream(r, entry, text)
                else:
                    data = await r.json(content_type=None)
                    self._token(entry, 0)
                    usage_tokens = int((data.get("usage") or {}).get("completion_tokens") or 1)
                    text.append(_choice_text(data))
                with self.stats.lock:
                    self.stats.completed += 1
                    self.stats.consecutive_failures = 0
                    if usage_tokens is not None:
                        # the server's count is exact (a chunk may carry several tokens)
                        self.stats.tokens += max(0, usage_tokens - entry.chunks)
                ok = True
                source.answered(spec, "".join(text))
                return True
        except asyncio.CancelledError:
            self._error("cancelled", counts_as_failure=False)  # our own stop, not the server's
            raise
        except TimeoutError:
            self._error("timeout")
            return False
        except (aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:  # incl. bad JSON from the server
            self._error(type(exc).__name__)
            return False
        finally:
            with self.stats.lock:
                self.stats.open.pop(rid, None)
                if not ok:
                    self.stats.failed += 1

    async def _read_stream(self, r: aiohttp.ClientResponse, entry: _Open, text: list[str]) -> int | None:
        usage_tokens = None
        async for raw in r.content:
            payload = data_payload(raw)
            if payload is None:
                continue
            if payload == DONE:
                break
            try:
                data = json.loads(payload)
            except ValueError:
                continue
            usage = data.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = int(usage["completion_tokens"])
            piece = _choice_text(data)
            if piece:
                self._token(entry, 1)
                text.append(piece)
        return usage_tokens

    def _token(self, entry: _Open, count: int) -> None:
        now = self.clock()
        with self.stats.lock:
            if entry.first_token_at is None:
                entry.first_token_at = now
                self.stats.ttft_s.append(now - entry.started)
            else:
                gap = now - (entry.last_token_at or now)
                self.stats.gaps_s.append(gap)
                self.stats.max_gap_s = max(self.stats.max_gap_s, gap)
            entry.last_token_at = now
            entry.chunks += count
            self.stats.tokens += count
            self.stats.last_token_at = now

    def _error(self, what: str, counts_as_failure: bool = True) -> None:
        with self.stats.lock:
            self.stats.errors[what] = self.stats.errors.get(what, 0) + 1
            if counts_as_failure:
                self.stats.consecutive_failures += 1
                self.stats.last_error = what


def _choice_text(data: Mapping[str, Any]) -> str:
    choices = data.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    return c.get("text") or (c.get("delta") or {}).get("content") or (c.get("message") or {}).get("content") or ""
