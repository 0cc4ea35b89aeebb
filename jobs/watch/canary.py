"""The canary: one tiny streaming completion at a time, as a liveness probe of an idle or doubtful server.

A few tokens (`max_tokens` small, `ignore_eos`, temperature 0), streamed, so the first token proves the
engine steps and a silence is timed token by token. It runs in a daemon thread; `snapshot()` is the
soak load driver's `StreamState`, so the soak's detectors read it unchanged. Failures are sorted for
the loop: a refused connection is `down` (not counted), a timeout is the stall detectors' business
(`ErrorsDetector` ignores it), a 5xx or an error in the stream counts towards a dead engine.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Callable

from soakmatrix.jobs.detect.protocol import StreamState

PROMPT = "Reply with one word: ok"
PROMPT_TOKENS = 8   # about; the stall threshold's prefill allowance for it is negligible


class Canary:
    def __init__(self, base_url: str, *, model: str | None = None, max_tokens: int = 4,
                 timeout_s: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        u = urllib.parse.urlsplit(base_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.prefix = u.path.rstrip("/")
        self.model, self.max_tokens, self.timeout_s, self.clock = model, max_tokens, timeout_s, clock
        self._lock = threading.Lock()
        self._open_since: float | None = None
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._tokens = 0
        self._failures = 0
        self._last_error: str | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False
        self.sent = 0
        self.completed = 0
        self.last_latency_s: float | None = None     # time to first token of the latest canary
        self.on_done: Callable[[float | None, str | None], None] | None = None

    # ------------------------------------------------------------------ control

    @property
    def open(self) -> bool:
        return self._open_since is not None

    def send(self) -> bool:
        """Start one canary unless one is in flight."""
        with self._lock:
            if self._open_since is not None:
                return False
            self._open_since = self.clock()
            self._first_token_at = None
            self._tokens = 0
            self._aborted = False
            self.sent += 1
        threading.Thread(target=self._run, name="watch-canary", daemon=True).start()
        return True

    def abort(self) -> None:
        """Give up on the canary in flight (a hung engine would hold it forever)."""
        with self._lock:
            self._aborted = True
            conn = self._conn
            self._open_since = None
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def snapshot(self) -> StreamState:
        with self._lock:
            waiting = self._open_since is not None and self._first_token_at is None
            return StreamState(
                at=self.clock(), open_streams=1 if self._open_since is not None else 0,
                last_token_at=self._last_token_at,
                oldest_waiting_first_token_since=self._open_since if waiting else None,
                waiting_first_token_prompt_len=PROMPT_TOKENS if waiting else 0, tokens=self._tokens,
                consecutive_failures=self._failures, last_error=self._last_error)

    # ------------------------------------------------------------------ the request

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout_s)

    def discover_model(self) -> str:
        conn = self._connection()
        conn.timeout = 10.0
        try:
            conn.request("GET", f"{self.prefix}/v1/models")
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"{}")
        finally:
            conn.close()
        models = data.get("data") or []
        if not models:
            raise ValueError("/v1/models lists no model")
        self.model = models[0]["id"]
        return self.model

    def _run(self) -> None:
        error: str | None = None
        server_fault = False
        conn = None
        try:
            model = self.model or self.discover_model()
            conn = self._connection()
            with self._lock:
                if self._aborted:
                    return
                self._conn = conn
            body = {"model": model, "prompt": PROMPT, "max_tokens": self.max_tokens, "stream": True,
                    "temperature": 0, "ignore_eos": True}
            conn.request("POST", f"{self.prefix}/v1/completions", json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                error, server_fault = f"HTTP {resp.status}", resp.status >= 500
                return
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    error, server_fault = f"stream error: {str(chunk['error'])[:200]}", True
                    return
                if chunk.get("choices"):
                    self._token()
        except ConnectionRefusedError:
            error = "refused"
        except (socket.timeout, TimeoutError):
            error = "timeout"
        except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            if conn is not None:
                conn.close()
            self._finish(error, server_fault)

    def _token(self) -> None:
        now = self.clock()
        with self._lock:
            if self._first_token_at is None and self._open_since is not None:
                self._first_token_at = now
                self.last_latency_s = now - self._open_since
            self._last_token_at = now
            self._tokens += 1

    def _finish(self, error: str | None, server_fault: bool) -> None:
        with self._lock:
            aborted = self._aborted
            self._conn = None
            self._open_since = None
            if aborted:
                return
            if error is None:
                self._failures, self._last_error = 0, None
                self.completed += 1
            else:
                self._last_error = error
                if server_fault:
                    self._failures += 1
            latency = self.last_latency_s if error is None else None
        if self.on_done is not None:
            self.on_done(latency, error)
