"""The hang watchdog: feeds every detector each tick and returns the first verdict.

Side effects live here and only here: a scraper thread polls /metrics (with a timeout; a slow or
failed scrape is "no sample", never a hang), a second thread records /health (kept in the timeline,
never trusted: a stuck vLLM answers 200), the server log is followed for new lines, the process is
polled for its exit, and the load driver is asked for its stream state. The detectors are pure
(`jobs/detect/protocol.py`). Everything seen is appended to `<artifacts>/watchdog.jsonl`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from soakmatrix.jobs.detect.progress import parse_metrics
from soakmatrix.jobs.detect.protocol import Detector, HangVerdict, MetricsSample, Tick, build_detectors


@dataclass(frozen=True)
class WatchdogConfig:
    tick_s: float = 0.5
    scrape_every_s: float = 1.0
    scrape_timeout_s: float = 5.0  # the CPU build's API server can take 4 s under load
    health_every_s: float = 5.0
    health_timeout_s: float = 3.0


def http_get(url: str, timeout_s: float) -> tuple[int, str]:
    """GET -> (status, body); a refused connection raises ConnectionRefusedError itself, so a caller
    can tell a server that is down (`soakmatrix watch`'s `down`) from one that does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise exc.reason from None
        raise


class LogFollower:
    """New complete lines of a growing file since the last call."""

    def __init__(self, path: str | Path, from_start: bool = True) -> None:
        self.path = Path(path)
        self.offset = 0 if from_start else (self.path.stat().st_size if self.path.exists() else 0)
        self._partial = b""

    def new_lines(self, max_bytes: int = 1_000_000) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(max_bytes)
        except OSError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]


class Watchdog:
    def __init__(
        self,
        server: Any,
        load: Any = None,
        detectors: Sequence[Detector] | None = None,
        config: WatchdogConfig = WatchdogConfig(),
        *,
        artifacts_dir: str | Path | None = None,
        clock: Callable[[], float] = time.time,
        get: Callable[[str, float], tuple[int, str]] = http_get,
    ) -> None:
        """`server`: .base_url, .poll(), .log_path (a RunningServer); `load`: .snapshot() or None."""
        self.server, self.load, self.config, self.clock, self.get = server, load, config, clock, get
        self.detectors = list(detectors) if detectors is not None else build_detectors()
        # start-up lines are the launcher's business (and may mention memory or NCCL harmlessly)
        self.log = LogFollower(server.log_path, from_start=False) if getattr(server, "log_path", None) else None
        folder = Path(artifacts_dir) if artifacts_dir else (Path(server.log_path).parent if self.log else None)
        self.timeline_path = folder / "watchdog.jsonl" if folder else None
        self._lock = threading.Lock()
        self._pending: list[MetricsSample] = []
        self._scrape_problem: str | None = None
        self.health: list[tuple[float, int | None]] = []
        self.last_sample: MetricsSample | None = None
        self.last_progress_at: float | None = None
        self.verdicts: list[HangVerdict] = []
        self._quit = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ background probes

    def _scraper(self) -> None:
        while not self._quit.is_set():
            t0 = time.monotonic()
            try:
                status, text = self.get(f"{self.server.base_url}/metrics", self.config.scrape_timeout_s)
                if status == 200:
                    sample = parse_metrics(text, at=self.clock(), elapsed_s=time.monotonic() - t0)
                    with self._lock:
                        self._pending.append(sample)
                else:
                    self._note_scrape(f"/metrics answered {status}")
            except Exception as exc:  # noqa: BLE001 - timeouts, refused connections, bad text: no sample this time
                self._note_scrape(f"/metrics: {type(exc).__name__}")
            self._quit.wait(max(0.0, self.config.scrape_every_s - (time.monotonic() - t0)))

    def _note_scrape(self, problem: str) -> None:
        with self._lock:
            self._scrape_problem = problem
        self._record({"t": self.clock(), "scrape_error": problem})

    def _health(self) -> None:
        while not self._quit.is_set():
            try:
                status, _ = self.get(f"{self.server.base_url}/health", self.config.health_timeout_s)
            except Exception:  # noqa: BLE001 - no answer, whatever the reason, is a failed health check
                status = None
            at = self.clock()
            self.health.append((at, status))
            self._record({"t": at, "health": status})
            self._quit.wait(self.config.health_every_s)

    def _record(self, entry: dict) -> None:
        if self.timeline_path is None:
            return
        try:
            with open(self.timeline_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError:
            pass

    def start(self) -> Watchdog:
        for target, name in ((self._scraper, "soak-scrape"), (self._health, "soak-health")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def close(self) -> None:
        self._quit.set()
        for t in self._threads:
            t.join(self.config.scrape_timeout_s + 1)

    # ------------------------------------------------------------ ticks

    def observe_once(self) -> Tick:
        with self._lock:
            samples, self._pending = self._pending, []
            problem, self._scrape_problem = self._scrape_problem, None
        stream = self.load.snapshot() if self.load is not None else None
        lines = self.log.new_lines() if self.log is not None else []
        now = self.clock()
        sample = samples[-1] if samples else None
        if sample is not None:
            prev = self.last_sample
            if prev is None or sample.generation_tokens != prev.generation_tokens:
                self.last_progress_at = sample.at
            self.last_sample = sample
            self._record(
                {
                    "t": sample.at,
                    "tokens": sample.generation_tokens,
                    "prompt": sample.prompt_tokens,
                    "running": sample.running,
                    "waiting": sample.waiting,
                    "scrape_s": round(sample.elapsed_s, 3),
                }
            )
        if stream is not None and stream.last_token_at is not None:
            self.last_progress_at = max(self.last_progress_at or 0.0, stream.last_token_at)
        return Tick(
            now=now, metrics=sample, stream=stream, log_lines=lines, exit_code=self.server.poll(), scrape_error=problem
        )

    def tick(self) -> HangVerdict | None:
        obs = self.observe_once()
        fired = [v for v in (d.observe(obs) for d in self.detectors) if v is not None]
        if not fired:
            return None
        primary = fired[0]
        if primary.since is None:
            primary = replace(primary, since=self.last_progress_at)
        if len(fired) > 1:
            primary = replace(
                primary, details={**primary.details, "also": [f"{v.detector}: {v.message}" for v in fired[1:]]}
            )
        self.verdicts.append(primary)
        self._record(
            {
                "t": primary.at,
                "verdict": primary.detector,
                "kind": primary.kind,
                "since": primary.since,
                "message": primary.message,
            }
        )
        return primary

    def watch(
        self, until: float, stop: threading.Event | None = None, done: Callable[[], bool] | None = None
    ) -> HangVerdict | None:
        """Tick until a detector fires (its verdict), `until` (a time.monotonic() deadline), `stop`
        is set, or `done()` says the load is over (None)."""
        if not self._threads:
            self.start()
        while True:
            verdict = self.tick()
            if verdict is not None:
                return verdict
            if time.monotonic() >= until or (stop is not None and stop.is_set()) or (done and done()):
                return None
            if stop is not None:
                stop.wait(self.config.tick_s)
            else:
                time.sleep(self.config.tick_s)

    def log_lines_seen(self) -> list[str]:
        lines: list[str] = []
        for d in self.detectors:
            lines.extend(getattr(d, "seen", []))
        return lines

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
