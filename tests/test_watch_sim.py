"""The watch against the simulated engine on 127.0.0.1: zero false alarms on an idle server, slow
clients, a restart and a 100k-token prefill; a planted hang caught; the canary's own behaviour."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from soakmatrix.fixtures.sim_testing import SimProcess, free_port, load
from soakmatrix.jobs.watch.canary import Canary
from soakmatrix.jobs.watch.incident import IncidentOptions
from soakmatrix.jobs.watch.loop import LoopConfig
from soakmatrix.jobs.watch.runner import Watcher, WatchOptions
from soakmatrix.jobs.watch.target import Target

pytestmark = [pytest.mark.slow, pytest.mark.waits, pytest.mark.timeout(240)]


def watch(url, tmp_path, seconds, every=1.0, **opts):
    """Run a Watcher for `seconds` in a thread (or until `w.stop` is set); returns (watcher, thread, notes)."""
    notes: list[str] = []
    w = Watcher(Target(url), IncidentOptions(tmp_path / "incidents", budget_s=15), on_note=notes.append,
                options=WatchOptions(loop=LoopConfig(canary_every_s=every), **opts))
    w.stop = threading.Event()
    t = threading.Thread(target=w.run, args=(w.stop, time.monotonic() + seconds), daemon=True)
    t.start()
    return w, t, notes


def test_canary_streams_tokens_and_a_refused_connection_is_not_a_failure(tmp_path):
    with SimProcess([], tmp_path / "sim.log") as sim:
        c = Canary(sim.url)
        assert c.send() and not c.send()          # one at a time
        deadline = time.monotonic() + 10
        while c.open and time.monotonic() < deadline:
            time.sleep(0.02)
        snap = c.snapshot()
        assert snap.tokens == 4 and snap.consecutive_failures == 0 and c.last_latency_s is not None
    c = Canary(f"http://127.0.0.1:{free_port()}", model="m")
    c.send()
    deadline = time.monotonic() + 10
    while c.open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.snapshot().last_error == "refused" and c.snapshot().consecutive_failures == 0


def test_idle_server_no_alarm(tmp_path):
    with SimProcess([], tmp_path / "sim.log") as sim:
        w, t, notes = watch(sim.url, tmp_path, 20)
        t.join(40)
    assert w.incidents == [], notes
    assert w.canary.completed >= 8 and w.state == "idle"


def test_slow_clients_no_alarm(tmp_path):
    import http.client

    def slow_reader() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "x " * 50, "max_tokens": 400,
                                                             "stream": True, "ignore_eos": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        for _ in resp:
            time.sleep(0.2)          # a client that reads a chunk every 0.2 s
        conn.close()

    with SimProcess([], tmp_path / "sim.log") as sim:
        w, t, notes = watch(sim.url, tmp_path, 20)
        readers = [threading.Thread(target=slow_reader, daemon=True) for _ in range(6)]
        for r in readers:
            r.start()
        t.join(40)
    assert w.incidents == [], notes


def test_restart_is_down_not_hung(tmp_path):
    port = free_port()
    sim = SimProcess([], tmp_path / "sim1.log", port=port).start()
    w, t, notes = watch(sim.url, tmp_path, 25)
    try:
        load(sim.url, 4, 5)
        first_pid = w.target.pid
        sim.stop()
        time.sleep(4)
        assert w.state == "down"
        sim = SimProcess([], tmp_path / "sim2.log", port=port).start()
        load(sim.url, 4, 5)
        t.join(40)
    finally:
        sim.stop()
    assert w.incidents == [], notes
    assert any("server down" in n for n in notes) and any("back after down" in n for n in notes)
    assert w.target.pid not in (None, first_pid)


def test_long_prefill_no_alarm(tmp_path):
    # a 100k-token prompt with chunked prefill: 13 steps growing to ~7 s each at half the sim's speed
    args = ["--max-model-len", "131072", "--step-time-scale", "0.5"]
    with SimProcess(args, tmp_path / "sim.log") as sim:
        w, t, notes = watch(sim.url, tmp_path, 90)
        body = json.dumps({"prompt": [7] * 100_000, "max_tokens": 8, "stream": False}).encode()
        req = urllib.request.Request(sim.url + "/v1/completions", body, {"Content-Type": "application/json"})
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=200) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 8
        took = time.monotonic() - t0
        time.sleep(2)
        w.stop.set()
        t.join(100)
    assert took > 30, "the prefill should have been long"
    assert w.incidents == [], notes


def test_planted_hang_under_load_caught_in_seconds(tmp_path):
    hangs = tmp_path / "hangs.yaml"
    hangs.write_text("seed: 3\nhangs:\n  - id: t-silent\n    style: silent_stall\n    when: {max_num_seqs: 251}\n"
                     "    min_running: 2\n    mttf_s: 3\n")
    record = tmp_path / "rec.jsonl"
    args = ["--max-num-seqs", "251", "--hang-model", str(hangs), "--hang-record", str(record)]
    with SimProcess(args, tmp_path / "sim.log") as sim:
        w, t, notes = watch(sim.url, tmp_path, 60, max_incidents=1)
        threading.Thread(target=load, args=(sim.url, 4, 40), kwargs={"request_timeout": 50}, daemon=True).start()
        t.join(70)
    assert len(w.incidents) == 1, notes
    inc = w.incidents[0]
    began = json.loads(record.read_text().splitlines()[0])["began_at"]
    assert inc.verdict.at - began <= 10.0
    assert inc.result.signature == "silent_stall" and "py_spy" in inc.result.artifacts
