"""The canary: one tiny streaming completion at a time, as a liveness probe of an idle or doubtful server.

A few tokens (`max_tokens` small, `ignore_eos`, temperature 0), streamed, so the first token proves the
engine steps and a silence is timed token by token. It runs in a daemon thread; `snapshot()` is the
soak load driver's `StreamState`, so the soak's detectors read it unchanged. Failures are sorted for
the loop: a refused connection is `down` (not counted), a timeout is the stall detectors' business
(`ErrorsDetector` ignores it), a 5xx or an error in the stream counts towards a dead engine. Its
requests (/v1/models, the completion) are bounded like every request of the watch (`bounded_http.py`):
a deadline longer than the stall threshold, a cap on the stream's bytes and on each line.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from soakmatrix.jobs.detect.protocol import StreamState
from soakmatrix.jobs.sse import DONE, data_payload

from .bounded_http import Exchange, HttpLimits, Outcome, RequestFailed, fetch

PROMPT = "Reply with one word: ok"
PROMPT_TOKENS = 8  # about; the stall threshold's prefill allowance for it is negligible


class Canary:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        max_tokens: int = 4,
        limits: HttpLimits = HttpLimits(),
        clock: Callable[[], float] = time.time,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.max_tokens, self.limits, self.clock = model, max_tokens, limits, clock
        self.on_outcome = on_outcome or (lambda outcome: None)
        self._lock = threading.Lock()
        self._open_since: float | None = None
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._tokens = 0
        self._failures = 0
        self._last_error: str | None = None
        self._exchange: Exchange | None = None
        self._aborted = False
        self._generation = 0  # a canary given up on may still end after its successor started
        self.sent = 0
        self.completed = 0
        self.last_latency_s: float | None = None  # time to first token of the latest canary
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
            self._generation += 1
            self.sent += 1
            generation = self._generation
        threading.Thread(target=self._run, args=(generation,), name="watch-canary", daemon=True).start()
        return True

    def abort(self) -> None:
        """Give up on the canary in flight (a hung engine would hold it forever)."""
        with self._lock:
            self._aborted = True
            exchange = self._exchange
            self._open_since = None
        if exchange is not None:
            exchange.abort()

    def snapshot(self) -> StreamState:
        with self._lock:
            waiting = self._open_since is not None and self._first_token_at is None
            return StreamState(
                at=self.clock(),
                open_streams=1 if self._open_since is not None else 0,
                last_token_at=self._last_token_at,
                oldest_waiting_first_token_since=self._open_since if waiting else None,
                waiting_first_token_prompt_len=PROMPT_TOKENS if waiting else 0,
                tokens=self._tokens,
                consecutive_failures=self._failures,
                last_error=self._last_error,
            )

    # ------------------------------------------------------------------ the request

    def discover_model(self) -> str:
        try:
            resp, outcome = fetch(
                f"{self.base_url}/v1/models",
                self.limits.models_s,
                self.limits.models_bytes,
                limits=self.limits,
                clock=self.clock,
            )
        except RequestFailed as exc:
            self.on_outcome(exc.outcome)
            raise
        self.on_outcome(outcome)
        if resp.status != 200:
            raise ValueError(f"/v1/models answered HTTP {resp.status}")
        try:
            data = json.loads(resp.body or b"{}")
            models = data.get("data") or []
            model = models[0]["id"] if models else None
        except (ValueError, AttributeError, KeyError, IndexError, TypeError):
            raise ValueError(
                f"/v1/models answered {resp.content_type or 'something'} that is not a model list"
            ) from None
        if not model:
            raise ValueError("/v1/models lists no model")
        self.model = str(model)
        return self.model

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._aborted

    def _run(self, generation: int) -> None:
        error: str | None = None
        server_fault = False
        exchange = None
        try:
            model = self.model or self.discover_model()
            body = {
                "model": model,
                "prompt": PROMPT,
                "max_tokens": self.max_tokens,
                "stream": True,
                "temperature": 0,
                "ignore_eos": True,
            }
            with self._lock:
                if not self._current(generation):
                    return
            exchange = Exchange(
                f"{self.base_url}/v1/completions",
                self.limits.canary_s,
                self.limits.canary_bytes,
                method="POST",
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
                connect_s=self.limits.connect_s,
                max_redirects=self.limits.max_redirects,
                clock=self.clock,
            )
            with self._lock:
                aborted = not self._current(generation)
                if not aborted:
                    self._exchange = exchange
            if aborted:
                return
            if exchange.status != 200:
                exchange.read()  # bounded: an error's body is small, or a failure
                self.on_outcome(exchange.outcome())
                error, server_fault = f"HTTP {exchange.status}", (exchange.status or 0) >= 500
                return
            for line in exchange.lines(self.limits.line_bytes):
                payload = data_payload(line)
                if payload is None:
                    continue
                if payload == DONE:
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    error = f"/v1/completions: a stream line that is not JSON ({payload[:40]!r}...)"
                    self.on_outcome(exchange.bad(error.split(": ", 1)[1]))
                    return
                if isinstance(chunk, dict) and "error" in chunk:
                    error, server_fault = f"stream error: {str(chunk['error'])[:200]}", True
                    self.on_outcome(exchange.outcome())
                    return
                if isinstance(chunk, dict) and chunk.get("choices"):
                    self._token(generation)
            self.on_outcome(exchange.outcome())
        except RequestFailed as exc:
            o = exc.outcome
            if self._current(generation):
                self.on_outcome(o)
            error = (
                "refused"
                if o.reason == "refused"
                else "timeout"
                if o.reason == "deadline"
                else f"{o.path}: {o.detail}"[:200]
            )
        except (OSError, ValueError, KeyError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            if exchange is not None:
                exchange.close()
            self._finish(generation, error, server_fault)

    def _token(self, generation: int) -> None:
        now = self.clock()
        with self._lock:
            if not self._current(generation):
                return
            if self._first_token_at is None and self._open_since is not None:
                self._first_token_at = now
                self.last_latency_s = now - self._open_since
            self._last_token_at = now
            self._tokens += 1

    def _finish(self, generation: int, error: str | None, server_fault: bool) -> None:
        with self._lock:
            if not self._current(generation):
                return
            self._exchange = None
            self._open_since = None
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
