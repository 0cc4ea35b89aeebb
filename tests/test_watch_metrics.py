"""The watch's own Prometheus metrics, scraped over HTTP as a user's Prometheus would."""

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from soakmatrix.jobs.watch.metrics import WatchMetrics


def test_metrics_are_served_and_parse():
    m = WatchMetrics()
    m.observe("busy", 2.5)
    m.canary_done(0.12, None)
    m.canary_done(None, "HTTP 500")
    m.incident("silent_stall", "passive_progress", 1_700_000_000.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = m.serve(port, "127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("soakmatrix_watch_hangs_total", (("detector", "passive_progress"), ("signature", "silent_stall")))] == 1
    assert samples[("soakmatrix_watch_seconds_since_progress", ())] == 2.5
    assert samples[("soakmatrix_watch_state", (("soakmatrix_watch_state", "busy"),))] == 1
    assert samples[("soakmatrix_watch_canary_latency_seconds_count", ())] == 1
    assert samples[("soakmatrix_watch_canary_failures_total", (("reason", "HTTP 500"),))] == 1
