"""The watch's own Prometheus metrics, so users alert on hangs from the stack they already run.

    soakmatrix_watch_hangs_total{signature,detector}    incidents found (hangs and crashes)
    soakmatrix_watch_seconds_since_progress             since the last counter movement or canary token
    soakmatrix_watch_canary_latency_seconds             time to the canary's first token (histogram)
    soakmatrix_watch_canary_failures_total{reason}      canaries that failed (refused, timeout, 5xx, ...)
    soakmatrix_watch_state{soakmatrix_watch_state=...}  starting | idle | busy | stale | hung | down
    soakmatrix_watch_last_incident_timestamp_seconds    when the latest incident was found

A registry of its own (not the process-global one), served on `--metrics-port` when asked.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, start_http_server

from .loop import STATES


class WatchMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.hangs = Counter(
            "soakmatrix_watch_hangs",
            "Hangs and crashes found by soakmatrix watch.",
            ["signature", "detector"],
            registry=r,
        )
        self.since_progress = Gauge(
            "soakmatrix_watch_seconds_since_progress",
            "Seconds since the server's counters moved or the canary got a token.",
            registry=r,
        )
        self.canary_latency = Histogram(
            "soakmatrix_watch_canary_latency_seconds",
            "Time to the first token of the canary request.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.canary_failures = Counter(
            "soakmatrix_watch_canary_failures", "Canary requests that failed.", ["reason"], registry=r
        )
        self.state = Enum(
            "soakmatrix_watch_state", "What the watch thinks of the server.", states=list(STATES), registry=r
        )
        self.last_incident = Gauge(
            "soakmatrix_watch_last_incident_timestamp_seconds", "Unix time of the latest incident.", registry=r
        )

    def canary_done(self, latency_s: float | None, error: str | None) -> None:
        if error is None:
            if latency_s is not None:
                self.canary_latency.observe(latency_s)
            return
        reason = error.split(":")[0].split(" ")[0] if not error.startswith("HTTP") else error[:8]
        self.canary_failures.labels(reason=reason).inc()

    def observe(self, state: str, seconds_since_progress: float | None) -> None:
        self.state.state(state)
        if seconds_since_progress is not None:
            self.since_progress.set(seconds_since_progress)

    def incident(self, signature: str | None, detector: str, at: float) -> None:
        self.hangs.labels(signature=signature or "unclassified", detector=detector).inc()
        self.last_incident.set(at)

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve /metrics on `port`; returns the server (its `.shutdown()` stops it)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
