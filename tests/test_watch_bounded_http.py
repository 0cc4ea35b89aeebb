"""Every request of the watch ends by its deadline and within its cap, whatever the server does; the
outcome says how; a couple of redirects are followed, credentials in the URL become basic auth; the
canary against broken servers fails as the loop expects (refused, timeout, a cap), never grows."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from tests.broken_servers import BrokenServer

from soakmatrix.jobs.watch.bounded_http import HttpLimits, Reachability, RequestFailed, describe_problem, fetch
from soakmatrix.jobs.watch.canary import Canary


pytestmark = pytest.mark.timeout(60)
LIMITS = HttpLimits(connect_s=1.0, max_redirects=3)


def failed(url: str, deadline_s: float = 1.0, cap: int = 1 << 20):
    with pytest.raises(RequestFailed) as info:
        fetch(url, deadline_s, cap, limits=LIMITS)
    return info.value.outcome


@pytest.mark.parametrize("kind, reason, says", [
    ("silent", "deadline", "connection accepted, no answer within 1 s"),
    ("drip_headers", "deadline", "connection accepted, no answer within 1 s"),
    ("drip", "deadline", "answered 200, body unfinished after 1 s"),
    ("endless", "cap", "answered 200 with a body over the 1 MB cap"),
    ("huge", "cap", "declaring 1073741824 bytes, over the 1 MB cap"),
    ("reset", "reset", "connection reset"),
    ("redirect", "redirects", "redirect loop: more than 3 redirects")])
def test_each_broken_server_ends_within_the_deadline_with_its_reason(kind, reason, says):
    with BrokenServer(kind) as server:
        t0 = time.monotonic()
        o = failed(server.url + "/metrics")
        took = time.monotonic() - t0
    assert (o.reason, o.path) == (reason, "/metrics") and says in o.detail, o
    assert took < 1.5 and o.nbytes <= (1 << 20) + 1


def test_refused_is_unreachable_and_a_connection_refused_error():
    with BrokenServer("html") as server:
        url = server.url
    with pytest.raises(ConnectionRefusedError) as info:
        fetch(url + "/health", 1.0, 1024, limits=LIMITS)
    assert info.value.outcome.kind == "unreachable" and describe_problem(info.value.outcome) == "unreachable: connection refused"


class _Handler(http.server.BaseHTTPRequestHandler):
    seen_auth: list = []

    def do_GET(self):
        _Handler.seen_auth.append(self.headers.get("Authorization"))
        if self.path == "/old":
            self.send_response(301)
            self.send_header("Location", "/metrics")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"vllm:num_requests_running 0\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_redirect_is_followed_and_url_credentials_become_basic_auth():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        resp, o = fetch(f"http://admin:s3cret@127.0.0.1:{httpd.server_port}/old", 2.0, 1024, limits=LIMITS)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert resp.status == 200 and resp.body.startswith(b"vllm:") and o.kind == "answered" and o.content_type == "text/plain"
    assert _Handler.seen_auth[-1] == "Basic YWRtaW46czNjcmV0"   # admin:s3cret
    assert describe_problem(o) is None


def test_reachability_keeps_the_latest_answer_and_the_unanswered_since():
    reach = Reachability(answered_at=0.0)
    with BrokenServer("html") as html, BrokenServer("silent") as silent:
        _, answered = fetch(html.url + "/health", 1.0, 1 << 16, limits=LIMITS)
        reach.record(answered)
        reach.record(failed(silent.url + "/metrics"))
    at, unanswered, unreachable = reach.take()
    assert at == answered.at and unanswered.reason == "deadline" and unreachable is None
    assert set(reach.problems()) == {"/health", "/metrics"}   # HTML is a problem too, but an answer


def run_canary(url: str, **limits) -> Canary:
    outcomes = []
    c = Canary(url, model="m", limits=HttpLimits(connect_s=1.0, **limits), on_outcome=outcomes.append)
    c.outcomes = outcomes
    assert c.send()
    ends = time.monotonic() + 10
    while c.open and time.monotonic() < ends:
        time.sleep(0.02)
    assert not c.open
    return c


@pytest.mark.parametrize("kind, error", [("drip", "timeout"), ("silent", "timeout"),
                                         ("endless", "/v1/completions: a stream line that is not JSON ('xxxx"),
                                         ("html", None), ("error", "HTTP 500")])
def test_the_canary_against_broken_servers(kind, error):
    with BrokenServer(kind) as server:
        c = run_canary(server.url, canary_s=1.0)
    snap = c.snapshot()
    assert (snap.last_error or "").startswith(error or "") and (snap.last_error is None) == (error is None)
    assert snap.tokens == 0
    assert snap.consecutive_failures == (1 if kind == "error" else 0)   # only a 5xx counts towards a dead engine
    assert c.outcomes and c.outcomes[-1].path == "/v1/completions"
