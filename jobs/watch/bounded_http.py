"""Every HTTP request of the watch, bounded: one total deadline and one size cap per kind of request.

A watched server may be the broken one: it may accept a connection and never answer, send its headers
and then a byte a second, stream without end or send a gigabyte. Per-operation socket timeouts do not
bound a server that drips, so each request has a total deadline (connect, first byte and whole body
together), enforced by a timer that shuts the socket down when it passes, and a cap on the bytes it
reads (a declared Content-Length over the cap is refused before its first byte). Redirects are followed
a few times only. `http.client` does the HTTP; this module decides how long and how much.

Each request ends as an `Outcome` the watch can reason about: `answered` (any status, the body in
full), `unreachable` (refused, reset, closed before answering: nothing serves), `unanswered` (the
deadline or the cap came first: the server took the connection but gave no usable answer) or `bad`
(it answered promptly, but not what was asked: HTML, a redirect loop, not HTTP). `Reachability` keeps
what the latest requests saw for the loop and for the watch's notes.
"""

from __future__ import annotations

import base64
import errno
import http.client
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from soakmatrix.matrix.contracts.redact import redact_text


@dataclass(frozen=True)
class HttpLimits:
    # the kernel completes the handshake even for a stuck process; a slow connect is a full backlog
    # or a network path that drops packets, either of which no longer serves
    connect_s: float = 3.0
    # vLLM's /health answers an empty body at once unless the API server's event loop is blocked
    health_s: float = 3.0
    # /health has no body; a page of a few KB is a proxy's error page, anything past 64 KB is not health
    health_bytes: int = 64 * 1024
    # the CPU build's API server takes up to 4 s for /metrics under load
    metrics_s: float = 5.0
    # vLLM's /metrics is 50-300 KB; histograms per LoRA adapter and engine reach a few MB
    metrics_bytes: int = 8 * 1024 * 1024
    # /v1/models lists the served model and its adapters: an answer in well under a second
    models_s: float = 10.0
    # a few KB per model; a thousand LoRA adapters stay under 1 MB
    models_bytes: int = 1024 * 1024
    # the canary must outlive the stall threshold (its ceiling, 30 s by default, plus the prefill
    # allowance): its silence is what the canary detector times, and an ended canary is no silence.
    # The watch raises it to twice a higher --ceiling.
    canary_s: float = 90.0
    # 4 tokens stream as ~1 KB of server-sent events; a stream past 1 MB is not that completion
    canary_bytes: int = 1024 * 1024
    # one server-sent event line of the canary; a token's JSON is a few hundred bytes
    line_bytes: int = 64 * 1024
    # the evidence's /metrics snapshot: what the scrape could not get in 5 s it will not get in 10
    evidence_metrics_s: float = 5.0
    # a load balancer may redirect once or twice (http -> https, a trailing slash); more is a loop
    max_redirects: int = 3

    def for_path(self, path: str) -> tuple[float, int]:
        """(deadline, cap) of a GET by its path."""
        if path.endswith("/metrics"):
            return self.metrics_s, self.metrics_bytes
        if path.endswith("/health"):
            return self.health_s, self.health_bytes
        return self.models_s, self.models_bytes


@dataclass(frozen=True)
class Outcome:
    path: str
    kind: str  # answered | unreachable | unanswered | bad
    reason: str  # answered | refused | reset | closed | unresolved | deadline | cap | redirects | protocol
    detail: str  # for a person: "connection refused", "no answer within 5.0 s", ...
    at: float
    status: int | None = None
    content_type: str = ""
    nbytes: int = 0


class RequestFailed(Exception):
    """A request that ended without a usable answer; `outcome` says how."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(f"{outcome.path}: {outcome.detail}")
        self.outcome = outcome


class Unreachable(RequestFailed, ConnectionRefusedError):
    """Nothing serves (refused, reset, closed): a `ConnectionRefusedError`, so the soak watchdog's
    "refused is down" reading holds for all of them."""


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes
    url: str


def redacted(url: str) -> str:
    return redact_text(url)


class _Guard:
    """Shuts the socket down when the deadline passes, whatever http.client is blocked in."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.ends_at = time.monotonic() + deadline_s
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return self.ends_at - time.monotonic()

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            fired = self.fired
        if fired:
            _shutdown(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._sock
        _shutdown(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shutdown(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:  # the plain socket's shutdown: an SSLSocket's own would drop its state under a reader
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class Exchange:
    """One request on its own connection: status and headers, then the body in bounded pieces.
    `abort()` (any thread) ends it at once."""

    def __init__(
        self,
        url: str,
        deadline_s: float,
        max_bytes: int,
        *,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        connect_s: float = 3.0,
        max_redirects: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = urllib.parse.urlsplit(url).path or "/"
        self.deadline_s, self.max_bytes, self.clock = deadline_s, max_bytes, clock
        self.guard = _Guard(deadline_s)
        self.nbytes = 0
        self.status: int | None = None
        self.content_type = ""
        self._conn: http.client.HTTPConnection | None = None
        self._resp: http.client.HTTPResponse | None = None
        self._aborted = False
        try:
            self._open(url, method, body, headers or {}, connect_s, max_redirects)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening, with redirects

    def _open(
        self, url: str, method: str, body: bytes | None, headers: dict[str, str], connect_s: float, max_redirects: int
    ) -> None:
        seen = [url]
        while True:
            resp = self._request(url, method, body, headers, connect_s)
            location = resp.getheader("Location")
            if resp.status not in (301, 302, 303, 307, 308) or not location:
                self._resp, self.status = resp, resp.status
                self.content_type = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
                declared = resp.getheader("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.max_bytes:
                    raise self._failed(
                        "unanswered",
                        "cap",
                        f"answered {resp.status} declaring {int(declared)} bytes, over the {_size(self.max_bytes)} cap",
                    )
                return
            if len(seen) > max_redirects:
                hops = " -> ".join(urllib.parse.urlsplit(u).path or "/" for u in seen[-3:])
                raise self._failed(
                    "bad", "redirects", f"redirect loop: more than {max_redirects} redirects ({hops} -> ...)"
                )
            url = urllib.parse.urljoin(url, location)
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise self._failed("bad", "redirects", f"redirected to a non-HTTP location {redacted(url)!r}")
            seen.append(url)
            if resp.status == 303:
                method, body = "GET", None
            if self._conn is not None:
                self._conn.close()

    def _request(
        self, url: str, method: str, body: bytes | None, headers: dict[str, str], connect_s: float
    ) -> http.client.HTTPResponse:
        u = urllib.parse.urlsplit(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        left = self.guard.left()
        if left <= 0:
            raise self._deadline("connect")
        self._conn = conn = cls(u.hostname or "127.0.0.1", port, timeout=max(0.01, min(connect_s, left)))
        headers = dict(headers)
        if u.username is not None:  # user:password@ in the URL: HTTP basic auth, as curl does
            creds = f"{urllib.parse.unquote(u.username)}:{urllib.parse.unquote(u.password or '')}"
            headers.setdefault("Authorization", "Basic " + base64.b64encode(creds.encode()).decode())
        phase = "connect"
        try:
            conn.connect()
            phase = "answer"
            self.guard.watch(conn.sock)
            conn.sock.settimeout(max(0.01, self.guard.left()))
            target = (u.path or "/") + (f"?{u.query}" if u.query else "")
            conn.request(method, target, body, headers)
            resp = conn.getresponse()
        except RequestFailed:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure, KeyboardInterrupt included, is classified
            raise self._classify(exc, phase) from None
        if self.guard.fired:  # headers cut short by the deadline read as if they had ended
            raise self._deadline("answer")
        return resp

    # ------------------------------------------------------------------ the body

    def chunks(self, size: int = 65536) -> Iterator[bytes]:
        """The body in pieces, until its end, the cap or the deadline (both raise `RequestFailed`)."""
        resp = self._resp
        assert resp is not None
        while True:
            if self.guard.left() <= 0:
                raise self._deadline("body")
            try:
                data = resp.read1(min(size, self.max_bytes - self.nbytes + 1))  # never past the cap
            except RequestFailed:
                raise
            except BaseException as exc:  # noqa: BLE001 - every failure, KeyboardInterrupt included, is classified
                raise self._classify(exc, "body") from None
            if not data:
                if self.guard.fired or self._aborted:
                    raise self._deadline("body")
                return
            self.nbytes += len(data)
            if self.nbytes > self.max_bytes:
                raise self._failed(
                    "unanswered",
                    "cap",
                    f"answered {self.status} with a body over the {_size(self.max_bytes)} cap (still sending)",
                )
            yield data

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self, max_line: int) -> Iterator[str]:
        """The body's lines (server-sent events); a line longer than `max_line` is a failure."""
        partial = b""
        for data in self.chunks():
            partial += data
            *complete, partial = partial.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", "replace")
            if len(partial) > max_line:
                raise self._failed("unanswered", "cap", f"a line over {_size(max_line)} in the stream")
        if partial:
            yield partial.decode("utf-8", "replace")

    def outcome(self) -> Outcome:
        """An answer read in full."""
        ctype = f" {self.content_type}" if self.content_type else ""
        return Outcome(
            self.path,
            "answered",
            "answered",
            f"answered {self.status}{ctype}",
            self.clock(),
            self.status,
            self.content_type,
            self.nbytes,
        )

    def bad(self, detail: str) -> Outcome:
        """A prompt answer that is not what was asked (a stream that is not server-sent events of JSON)."""
        return self._failed("bad", "protocol", detail).outcome

    def abort(self) -> None:
        self._aborted = True
        self.guard.watch(None)
        conn = self._conn
        _shutdown(getattr(conn, "sock", None) if conn is not None else None)

    def close(self) -> None:
        self.guard.cancel()
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ failures

    def _failed(self, kind: str, reason: str, detail: str) -> RequestFailed:
        outcome = Outcome(self.path, kind, reason, detail, self.clock(), self.status, self.content_type, self.nbytes)
        return Unreachable(outcome) if kind == "unreachable" else RequestFailed(outcome)

    def _deadline(self, phase: str) -> RequestFailed:
        s = f"{self.deadline_s:g} s"
        if phase == "connect":
            return self._failed("unanswered", "deadline", f"no connection within {s}")
        if phase == "answer" or self.status is None:
            return self._failed("unanswered", "deadline", f"connection accepted, no answer within {s}")
        return self._failed(
            "unanswered", "deadline", f"answered {self.status}, body unfinished after {s} ({self.nbytes} bytes)"
        )

    def _classify(self, exc: BaseException, phase: str) -> RequestFailed:
        if self.guard.fired or isinstance(exc, (socket.timeout, TimeoutError)):
            return self._deadline(phase)
        if self._aborted:
            return self._failed("unanswered", "aborted", "aborted by the watch")
        if isinstance(exc, ConnectionRefusedError):
            return self._failed("unreachable", "refused", "connection refused")
        if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
            return self._failed("unreachable", "reset", "connection reset")
        if isinstance(exc, http.client.RemoteDisconnected) and phase != "body":
            return self._failed("unreachable", "closed", "connection closed without an answer")
        if isinstance(exc, socket.gaierror):
            return self._failed("unreachable", "unresolved", f"host name not resolved ({exc.strerror})")
        if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return self._failed("unreachable", "no_route", exc.strerror or "no route to host")
        if isinstance(exc, http.client.IncompleteRead):
            return self._failed(
                "unanswered", "cut_short", f"answered {self.status}, body cut short ({self.nbytes} bytes)"
            )
        if isinstance(exc, (http.client.HTTPException, ValueError)):
            return self._failed("bad", "protocol", f"not an HTTP answer ({type(exc).__name__}: {str(exc)[:80]})")
        if isinstance(exc, (OSError, EOFError)):
            return self._failed("unreachable", "os_error", f"{type(exc).__name__}: {exc}"[:120])
        raise exc


def fetch(
    url: str,
    deadline_s: float,
    max_bytes: int,
    *,
    limits: HttpLimits = HttpLimits(),
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[Response, Outcome]:
    """One request read in full, within `deadline_s` and `max_bytes`; raises `RequestFailed`."""
    with Exchange(
        url,
        deadline_s,
        max_bytes,
        method=method,
        body=body,
        headers=headers,
        connect_s=limits.connect_s,
        max_redirects=limits.max_redirects,
        clock=clock,
    ) as ex:
        data = ex.read()
        return Response(ex.status or 0, ex.content_type, data, url), ex.outcome()


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MB" if n >= 1024 * 1024 else f"{n // 1024} KB"


# ------------------------------------------------------------------ what the requests saw


@dataclass
class Reachability:
    """The latest outcome of every path, and when the server last answered anything in full.
    Thread-safe: the scraper, the health prober and the canary all report here."""

    answered_at: float
    latest: dict[str, Outcome] = field(default_factory=dict)
    unanswered: Outcome | None = None  # the latest unanswered request since the last answer
    _unreachable: Outcome | None = None  # since the last `take()`
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.latest[outcome.path] = outcome
            if outcome.kind in ("answered", "bad"):  # a prompt answer, even a wrong one, is no silence
                self.answered_at = max(self.answered_at, outcome.at)
                self.unanswered = None
            elif outcome.kind == "unanswered":
                self.unanswered = outcome
            else:
                self._unreachable = outcome

    def take(self) -> tuple[float, Outcome | None, Outcome | None]:
        """(answered_at, unanswered since then, unreachable since the last take)."""
        with self._lock:
            unreachable, self._unreachable = self._unreachable, None
            return self.answered_at, self.unanswered, unreachable

    def problems(self) -> dict[str, str]:
        """Each path's trouble now, for a person ("/metrics" -> "answered 200 text/html, not ...")."""
        with self._lock:
            return {path: problem for path, o in self.latest.items() if (problem := describe_problem(o))}


def describe_problem(o: Outcome) -> str | None:
    """What is wrong with an outcome, in words; None when it is a plain answer."""
    if o.kind == "unreachable":
        return f"unreachable: {o.detail}"
    if o.kind in ("unanswered", "bad"):
        return o.detail
    if o.status is not None and o.status != 200:
        return f"answered HTTP {o.status}"
    if o.content_type == "text/html":
        return "answered 200 text/html, not what vLLM serves (a proxy's page? the wrong URL?)"
    return None
