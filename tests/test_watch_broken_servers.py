"""The watch against servers that misbehave (tests/broken_servers.py): a server that takes connections
and never answers, drips, or streams without end is a hang found within the threshold; refused or reset
connections, HTML, a redirect loop and 500s are states in the notes, and the watch goes on. Through the
public `Watcher` with short thresholds, and through the real CLI (its memory measured) for two of them."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tests.broken_servers import BrokenServer

from soakmatrix.jobs.watch.bounded_http import HttpLimits
from soakmatrix.jobs.watch.incident import IncidentOptions
from soakmatrix.jobs.watch.loop import LoopConfig
from soakmatrix.jobs.watch.runner import Watcher, WatchOptions
from soakmatrix.jobs.watchdog import WatchdogConfig
from soakmatrix.jobs.watch.target import Target


pytestmark = pytest.mark.timeout(60)

FLOOR_S = 1.5
SHORT = HttpLimits(connect_s=1.0, health_s=1.0, metrics_s=1.0, models_s=1.0, canary_s=6.0, evidence_metrics_s=1.0)
PROBE = WatchdogConfig(tick_s=0.1, scrape_every_s=0.3, health_every_s=0.5)


def watch(url: str, tmp_path: Path, seconds: float, **kw) -> tuple[Watcher, list[str], float]:
    """Watch `url` for up to `seconds` (until the first incident); returns (watcher, notes, wall s)."""
    notes: list[str] = []
    w = Watcher(Target(url), IncidentOptions(tmp_path / "incidents", budget_s=5), on_note=notes.append,
                options=WatchOptions(loop=LoopConfig(canary_every_s=1.0), probe=PROBE, limits=SHORT,
                                     threshold={"floor_s": FLOOR_S, "ceiling_s": 3.0}, max_incidents=1, **kw))
    # the broken server lives in this test's process: no py-spy of pytest itself
    w.capture = functools.partial(w.capture, pyspy=lambda pid, timeout_s: ("", "not dumped in this test"))
    t0 = time.monotonic()
    w.run(until=t0 + seconds)
    return w, notes, time.monotonic() - t0


@pytest.mark.parametrize("kind, latest", [("silent", "no answer within 1 s"),
                                          ("drip", "body unfinished after 1 s"),
                                          ("endless", "over the 8 MB cap"),
                                          ("huge", "declaring 1073741824 bytes")])
def test_a_server_that_takes_connections_and_gives_no_answer_is_a_hang_within_the_threshold(tmp_path, kind, latest):
    with BrokenServer(kind) as server:
        w, notes, wall = watch(server.url, tmp_path, 15)
    (incident,) = w.incidents
    v = incident.verdict
    assert v.detector == "unanswered" and v.kind == "hang", v.message
    # the verdict names the probe that failed last: /metrics, or /health, which the broken server fails
    # too (an endless body at /health's own 64 KB cap) and which can be last on a loaded machine
    last = re.search(r"latest: /(metrics|health): ", v.message)
    assert last and (last.group(1) == "health" or latest in v.message), v.message
    # the threshold, then at most one request's deadline and a tick; the evidence is bounded too
    assert FLOOR_S < v.at - w.started_at <= FLOOR_S + SHORT.metrics_s + 1.0, notes
    assert wall <= FLOOR_S + SHORT.metrics_s + 1.0 + SHORT.evidence_metrics_s + 2.0, notes
    result = json.loads((incident.folder / "result.json").read_text())
    assert result["outcome"] == "hang" and result["detector"] == "unanswered"
    assert "metrics snapshot failed" in (incident.folder / "evidence-notes.txt").read_text()
    assert any(latest in n for n in notes if n.startswith("/metrics:")), notes


@pytest.mark.parametrize("kind, state, says", [("reset", "down", "/metrics: unreachable: connection reset"),
                                               ("html", "starting", "/metrics: answered 200 text/html"),
                                               ("redirect", "starting", "/metrics: redirect loop: more than 3"),
                                               ("error", "starting", "/metrics: answered HTTP 500")])
def test_a_server_that_answers_wrongly_is_a_state_in_the_notes_and_the_watch_goes_on(tmp_path, kind, state, says):
    with BrokenServer(kind) as server:
        w, notes, wall = watch(server.url, tmp_path, FLOOR_S + 3 * SHORT.metrics_s)
        served = server.connections
    assert w.incidents == [] and w.state == state, notes
    assert wall >= FLOOR_S + 3 * SHORT.metrics_s - 0.1   # it kept watching to the end
    assert served >= 5                                    # and kept asking
    assert sum(says in n for n in notes) == 1, notes      # said once, not once a request


def test_refused_connections_are_down_not_a_hang(tmp_path):
    with BrokenServer("html") as server:
        url = server.url
    w, notes, _ = watch(url, tmp_path, FLOOR_S + 2.0)
    assert w.incidents == [] and w.state == "down"
    assert "/metrics: unreachable: connection refused" in notes


def test_the_password_of_the_url_is_never_printed(tmp_path):
    with BrokenServer("html") as server:
        url = server.url.replace("http://", "http://admin:hunter22@")
        w, notes, _ = watch(url, tmp_path, 1.0)
    assert notes and not any("hunter22" in n for n in notes)
    assert "hunter22" not in w.target.describe() and "admin:[redacted]@" in w.target.describe()


# ------------------------------------------------------------------ the real CLI, its memory measured

def cli_watch(kind: str, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """`soakmatrix watch` against a broken server in its own process; (result, peak RSS MB, wall s)."""
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("broken_servers.py")), kind,
                               "--lifetime", "60"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        url = f"http://admin:hunter22@127.0.0.1:{port}"
        t0 = time.monotonic()
        watch_proc = subprocess.Popen([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", url, "--pid",
                                       str(server.pid), "--floor", "2s", "--ceiling", "2s", "--max-incidents", "1",
                                       "--duration", "40s", "--evidence-budget", "10s", "--out",
                                       str(tmp_path / "out"), *extra], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        peak = 0
        proc = psutil.Process(watch_proc.pid)
        while watch_proc.poll() is None:
            try:
                peak = max(peak, proc.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.02)
        out, err = watch_proc.communicate(timeout=30)
        wall = time.monotonic() - t0
    finally:
        server.kill()
        server.wait()
    return subprocess.CompletedProcess(watch_proc.args, watch_proc.returncode, out, err), peak / 2**20, wall


@pytest.mark.parametrize("kind", ["endless", "huge"])
def test_cli_against_an_endless_or_huge_body_finds_the_hang_in_bounded_memory(tmp_path, kind):
    p, peak_mb, wall = cli_watch(kind, tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "HANG detected by unanswered" in p.stdout and "over the 8 MB cap" in p.stdout
    assert peak_mb < 200, peak_mb
    assert "hunter22" not in p.stdout + p.stderr and "admin:[redacted]@" in p.stdout
    (folder,) = [f for f in (tmp_path / "out").iterdir() if f.is_dir()]
    assert "hunter22" not in (folder / "result.json").read_text()
    print(f"{kind}: peak RSS {peak_mb:.0f} MB, {wall:.1f} s to exit")


def test_a_server_whose_process_is_gone_is_down_and_the_note_says_it_exited(tmp_path):
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("broken_servers.py")), "html"],
                              stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline().split()[1])
    server.kill()
    server.wait()
    notes: list[str] = []
    w = Watcher(Target(f"http://127.0.0.1:{port}", server.pid), IncidentOptions(tmp_path / "incidents"),
                on_note=notes.append, options=WatchOptions(probe=PROBE, limits=SHORT))
    w.target.resolve()   # as the CLI does first: the dead pid is dropped, nothing listens
    w.run(until=time.monotonic() + 1.5)
    assert w.incidents == [] and w.state == "down"
    assert f"pid {server.pid} is gone: the server exited (its log tells a stop from a crash)" in notes, notes
