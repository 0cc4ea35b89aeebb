"""`soakmatrix watch` on the simulated engine: false alarms under production-like traffic, detection latency.

False alarms: one simulated server watched for a traffic pattern of `--hours` simulated hours, each
hour one of idle / steady / burst / slow clients (streams read a chunk every 0.2-1 s) / long prompts
(the first 100k tokens, then 16k-100k, chunked prefill, beside short requests), a restart every 12
hours and a /metrics scrape that times out in every 8th hour, played `--compress` times faster than
real time (an idle hour lasts 3600/compress wall seconds; steps, prefills and the watch's thresholds
run at real speed). Any incident is a false alarm; each is listed with the load average, the watch's
own scheduling lag and the busiest processes, to tell CPU starvation from a detector fault. Latency:
one simulated server per trial with one planted hang (the detection benchmark's styles under load,
plus a silent stall of an idle server that only the canary can see); latency is the verdict's time
minus the moment the engine recorded the hang began.

    python -m benchmarks.bench_watch                    # 2 simulated hours, 2 hangs per style (~5 min)
    python -m benchmarks.bench_watch --hours 48 --per-style 10      # the long run
    python -m benchmarks.bench_watch --broken           # the real CLI against each broken server (~3 min)

Broken servers (`tests/broken_servers.py`, each in its own process): the real `soakmatrix watch` with its
default thresholds against a server that never answers, drips, streams without end, sends 1 GiB,
refuses, resets, answers HTML, redirects to itself or answers 500: what it ended as, the time from its
first note to the verdict and to its exit (the evidence kept), and its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from soakmatrix.fixtures.sim_testing import SimProcess, free_port, load
from soakmatrix.jobs.watch.incident import IncidentOptions
from soakmatrix.jobs.watch.logsource import FileLog
from soakmatrix.jobs.watch.loop import LoopConfig
from soakmatrix.jobs.watch.runner import Watcher, WatchOptions
from soakmatrix.jobs.watch.target import Target

HANGS = """seed: 13
hangs:
  - {id: w-silent, style: silent_stall, when: {max_num_seqs: 251}, min_running: 1, mttf_s: 4}
  - {id: w-event, style: event_sync_stall, when: {max_num_seqs: 252}, min_running: 2, mttf_s: 4}
  - {id: w-shm, style: shm_broadcast, when: {max_num_seqs: 253}, min_running: 1, mttf_s: 4}
  - {id: w-crash, style: crash, when: {max_num_seqs: 254}, min_running: 1, mttf_s: 4}
  - {id: w-idle, style: silent_stall, when: {max_num_seqs: 255}, min_running: 1, mttf_s: 0.3}
"""
STYLES = {"silent_stall": 251, "event_sync_stall": 252, "shm_broadcast": 253, "crash": 254, "idle_silent_stall": 255}
MODES = ("idle", "steady", "burst", "long_prompts", "slow_clients")
MODE_WEIGHTS = (4, 3, 2, 1, 1)
LONG_PROMPTS = (16_000, 32_000, 64_000, 100_000)


def watcher(url: str, out: Path, every: float, log: FileLog | None = None, on_incident=None,
            **kw) -> tuple[Watcher, list[str]]:
    notes: list[str] = []
    w = Watcher(Target(url), IncidentOptions(out, budget_s=15), log=log, on_incident=on_incident,
                on_note=lambda n: notes.append(f"{time.time():.1f} {n}"),
                options=WatchOptions(loop=LoopConfig(canary_every_s=every), **kw))
    return w, notes


# ------------------------------------------------------------------ latency

def one_trial(out: Path, style: str, i: int, every: float) -> dict:
    folder = out / f"{style}-{i}"
    folder.mkdir(parents=True)
    (folder / "hangs.yaml").write_text(HANGS)
    record = folder / "rec.jsonl"
    args = ["--max-num-seqs", str(STYLES[style]), "--hang-model", str(folder / "hangs.yaml"),
            "--hang-record", str(record), "--seed", str(100 + i)]
    row = {"style": style, "trial": i, "latency_s": None, "detector": None, "signature": None}
    with SimProcess(args, folder / "sim.log") as sim:
        w, notes = watcher(sim.url, folder / "incidents", every, log=FileLog(folder / "sim.log"), max_incidents=1)
        if style != "idle_silent_stall":
            threading.Thread(target=load, args=(sim.url, 4, 60), kwargs={"request_timeout": 70}, daemon=True).start()
        w.run(until=time.monotonic() + 90)
    row["fired"] = record.exists()   # an idle server's canaries may not reach the hang's MTTF in time
    if w.incidents and record.exists():
        inc = w.incidents[0]
        began = json.loads(record.read_text().splitlines()[0])["began_at"]
        row.update(latency_s=round(inc.verdict.at - began, 2), detector=inc.verdict.detector,
                   signature=inc.result.signature, evidence_s=round(inc.evidence.seconds, 2))
    return row


def measure_latency(out: Path, styles: Sequence[str], per_style: int, every: float) -> list[dict]:
    rows = []
    for i in range(per_style):
        for style in styles:
            row = one_trial(out / "latency", style, i, every)
            rows.append(row)
            print(f"  {style:<18} {row['latency_s']!s:>6} s  {row['detector'] or '-':<17} {row['signature']}", flush=True)
    return rows


# ------------------------------------------------------------------ false alarms

class FlakyScrape:
    """Wraps the watch's HTTP GET: once armed, the next /metrics scrape hangs for its whole timeout and
    raises, as a scrape of an API server busy for seconds does (the scrape carries no information)."""

    def __init__(self, get) -> None:
        self.get, self.armed, self.injected = get, threading.Event(), 0

    def __call__(self, url: str, timeout_s: float) -> tuple[int, str]:
        if url.endswith("/metrics") and self.armed.is_set():
            self.armed.clear()
            self.injected += 1
            time.sleep(timeout_s)
            raise TimeoutError("timed out (injected by the benchmark)")
        return self.get(url, timeout_s)


class LagMeter:
    """How late a 0.1 s sleep of this process wakes up: the CPU starvation the watch itself suffers
    when other processes hog the cores (a starved watch or engine can read as a stall)."""

    def __init__(self) -> None:
        self.worst, self._stop = 0.0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self._stop.wait(0.1)
            self.worst = max(self.worst, time.monotonic() - t0 - 0.1)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return round(worst, 2)

    def close(self) -> None:
        self._stop.set()


def busiest_processes(n: int = 5) -> list[str]:
    """The processes using the most CPU right now (who starves whom, when an alarm is raised)."""
    import psutil

    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(1.0)
    rows = []
    for p in procs:
        try:
            rows.append((p.cpu_percent(None), p.pid, " ".join((p.info["cmdline"] or [p.info["name"] or "?"])[:4])))
        except psutil.Error:
            continue
    return [f"{cpu:.0f}% {pid} {cmd[:100]}" for cpu, pid, cmd in sorted(rows, reverse=True)[:n]]


def long_prompts(url: str, seconds: float, rng: random.Random) -> int:
    """Long prompts one after another (the first of each hour 100k tokens), beside 2 short-request clients."""
    end = time.monotonic() + seconds
    short = threading.Thread(target=load, args=(url, 2, seconds), daemon=True,
                             kwargs={"max_tokens": 32, "prompt_words": 32, "request_timeout": 600})
    short.start()
    sent, n = 0, 100_000
    while time.monotonic() < end:
        body = json.dumps({"prompt": [rng.randrange(5, 400) for _ in range(n)], "max_tokens": 16}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=600).read()
            sent += 1
        except OSError:
            break
        n = rng.choice(LONG_PROMPTS)
    short.join(600)
    return sent


def slow_clients(url: str, seconds: float, rng: random.Random) -> None:
    """Streaming clients that read a chunk every 0.2-1 s: the server waits on them, the engine does not."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    end = time.monotonic() + seconds

    def reader(pause: float) -> None:
        while time.monotonic() < end:
            try:
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
                conn.request("POST", "/v1/completions", json.dumps({"prompt": "x " * 50, "max_tokens": 200,
                                                                     "stream": True, "ignore_eos": True}),
                             {"Content-Type": "application/json"})
                for _ in conn.getresponse():
                    time.sleep(pause)
                    if time.monotonic() >= end:
                        break
                conn.close()
            except OSError:
                return

    readers = [threading.Thread(target=reader, args=(rng.uniform(0.2, 1.0),), daemon=True) for _ in range(6)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(seconds + 130)


def play_hour(url: str, mode: str, seconds: float, rng: random.Random) -> None:
    if mode == "idle":
        time.sleep(seconds)
    elif mode == "steady":
        load(url, rng.randint(1, 4), seconds, max_tokens=64, prompt_words=rng.randint(16, 400), request_timeout=120)
    elif mode == "burst":
        quiet = seconds * 0.6
        time.sleep(quiet / 2)
        load(url, 32, seconds - quiet, max_tokens=32, prompt_words=64, request_timeout=120)
        time.sleep(quiet / 2)
    elif mode == "slow_clients":
        slow_clients(url, seconds, rng)
    else:
        long_prompts(url, seconds, rng)


def measure_false_alarms(out: Path, hours: int, compress: float, every: float, seed: int) -> dict:
    """Watch one server through `hours` simulated hours: a restart every 12, a /metrics scrape that
    times out in every 8th hour (at its middle), any incident a false alarm (with the load average, the
    watch's own scheduling lag and the busiest processes at that moment, to tell starvation apart)."""
    rng = random.Random(seed)
    port = free_port()
    args = ["--max-model-len", "131072"]
    sim = SimProcess(args, out / "sim-0.log", port=port).start()
    alarms: list[dict] = []
    lag = LagMeter()

    def on_incident(incident) -> None:
        alarms.append({"hour": hour + 1, "mode": mode, "message": incident.result.message,
                       "load1": round(os.getloadavg()[0], 1), "watch_lag_s": lag.worst,
                       "busiest": busiest_processes(), "evidence": str(incident.folder)})

    w, notes = watcher(sim.url, out / "alarms", every, on_incident=on_incident)
    flaky = FlakyScrape(w.dog.get)
    w.dog.get = flaky
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    modes: dict[str, int] = {}
    hourly: list[dict] = []
    restarts, hour, mode = 0, 0, "idle"
    t0 = time.monotonic()
    try:
        for hour in range(hours):
            if hour and hour % 12 == 0:
                sim.stop()
                time.sleep(2)
                sim = SimProcess(args, out / f"sim-{hour}.log", port=port).start()
                restarts += 1
            mode = rng.choices(MODES, weights=MODE_WEIGHTS)[0]
            modes[mode] = modes.get(mode, 0) + 1
            seconds = 3600 / compress
            if hour % 8 == 3:
                threading.Timer(seconds / 2, flaky.armed.set).start()
            h0 = time.monotonic()
            play_hour(sim.url, mode, seconds, rng)
            row = {"hour": hour + 1, "mode": mode, "wall_s": round(time.monotonic() - h0, 1),
                   "load1": round(os.getloadavg()[0], 1), "watch_lag_s": lag.take(), "alarms": len(w.incidents)}
            hourly.append(row)
            print(f"  hour {hour + 1:>3}/{hours}: {mode:<12} {row['wall_s']:>5} s  load {row['load1']:>4}  "
                  f"lag {row['watch_lag_s']:>5} s  incidents so far {len(w.incidents)}", flush=True)
    finally:
        stop.set()
        thread.join(30)
        sim.stop()
        lag.close()
    return {"hours": hours, "compress": compress, "wall_s": round(time.monotonic() - t0), "modes": modes,
            "restarts": restarts, "scrape_timeouts": flaky.injected, "false_alarms": len(w.incidents),
            "canaries": w.canary.sent, "alarms": alarms, "hourly": hourly, "notes": notes[-40:]}


# ------------------------------------------------------------------ broken servers

BROKEN_SERVERS = Path(__file__).resolve().parent.parent / "tests" / "broken_servers.py"
BROKEN_KINDS = ("silent", "drip", "drip_headers", "endless", "huge", "refused", "reset", "html", "redirect", "error")


def one_broken(out: Path, kind: str, state_s: float) -> dict:
    """The real CLI against one broken server; its notes timed, its RSS sampled every 20 ms."""
    import psutil

    server = subprocess.Popen([sys.executable, str(BROKEN_SERVERS), "html" if kind == "refused" else kind,
                               "--lifetime", "120"], stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline().split()[1])
    pid = server.pid
    if kind == "refused":   # nothing listens on the port any more
        server.kill()
        server.wait()
    argv = [sys.executable, "-m", "soakmatrix.matrix.cli", "watch", f"http://127.0.0.1:{port}", "--pid", str(pid),
            "--max-incidents", "1", "--duration", f"{state_s:g}s", "--out", str(out / kind)]
    watch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0, notes, peak = time.monotonic(), [], 0

    def read() -> None:
        for line in watch.stdout:
            notes.append((time.monotonic() - t0, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc = psutil.Process(watch.pid)
    while watch.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.02)
    wall = time.monotonic() - t0
    reader.join(5)
    if server.poll() is None:
        server.kill()
        server.wait()
    first = next((t for t, n in notes if "watch: watching" in n), 0.0)
    verdict = next(((t, n) for t, n in notes if " detected by " in n), None)
    kept = next((t for t, n in notes if "incident kept in" in n), None)
    states = [n.split("watch: ", 1)[1] for _, n in notes if "watch: state " in n or "watch: /metrics" in n]
    return {"kind": kind, "exit": watch.returncode, "peak_rss_mb": round(peak / 2**20, 1),
            "verdict_s": round(verdict[0] - first, 1) if verdict else None,
            "verdict": verdict[1].split("watch: ", 1)[1][:160] if verdict else None,
            "kept_s": round(kept - first, 1) if kept is not None else None,
            "exit_s": round(wall - first, 1), "states": states[:4]}


def measure_broken(out: Path, kinds: Sequence[str], state_s: float) -> list[dict]:
    rows = []
    for kind in kinds:
        row = one_broken(out / "broken", kind, state_s)
        rows.append(row)
        what = f"hang after {row['verdict_s']} s, evidence kept after {row['kept_s']} s" if row["verdict_s"] is not None \
            else f"no incident in {row['exit_s']} s: {'; '.join(row['states'])}"
        print(f"  {kind:<13} exit {row['exit']}  peak RSS {row['peak_rss_mb']:>5} MB  {what}", flush=True)
    return rows


def summarise(latency: list[dict], alarms: dict | None) -> str:
    lines = []
    if latency:
        lines += ["", f"{'style':<18} {'hangs':>5} {'found':>5} {'median s':>9} {'worst s':>8}  detectors / signatures"]
        for style in dict.fromkeys(r["style"] for r in latency):
            rows = [r for r in latency if r["style"] == style and r.get("fired")]
            lat = sorted(r["latency_s"] for r in rows if r["latency_s"] is not None)
            dets = sorted({f"{r['detector']}/{r['signature']}" for r in rows if r["detector"]})
            med = statistics.median(lat) if lat else float("nan")
            lines.append(f"{style:<18} {len(rows):>5} {len(lat):>5} {med:>9.1f} {max(lat, default=float('nan')):>8.1f}"
                         f"  {', '.join(dets)}")
    if alarms:
        lines += ["", f"false alarms: {alarms['false_alarms']} in {alarms['hours']} simulated hours "
                      f"(x{alarms['compress']:g}: {alarms['wall_s']} wall s; {alarms['modes']}; "
                      f"{alarms['restarts']} restarts; {alarms['scrape_timeouts']} scrape timeouts; "
                      f"{alarms['canaries']} canaries; worst watch lag "
                      f"{max((h['watch_lag_s'] for h in alarms['hourly']), default=0)} s)"]
        for a in alarms["alarms"]:
            lines += [f"  false alarm in hour {a['hour']} ({a['mode']}, load {a['load1']}, watch lag "
                      f"{a['watch_lag_s']} s): {a['message']}", *(f"    busy: {b}" for b in a["busiest"])]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_watch", description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=int, default=2, help="simulated hours of traffic (default 2; the claim: 48)")
    p.add_argument("--compress", type=float, default=120.0, help="simulated seconds per wall second (default 120)")
    p.add_argument("--per-style", type=int, default=2, help="planted hangs per style (default 2)")
    p.add_argument("--styles", default=",".join(STYLES))
    p.add_argument("--canary-every", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-false-alarms", action="store_true")
    p.add_argument("--broken", action="store_true", help="only the real CLI against each broken server")
    p.add_argument("--broken-kinds", default=",".join(BROKEN_KINDS))
    p.add_argument("--state-s", type=float, default=20.0, help="how long a broken server that is no hang is watched")
    p.add_argument("--out", help="keep artifacts here (default: a temporary folder)")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    ctx = tempfile.TemporaryDirectory(prefix="bench-watch-") if not args.out else None
    out = Path(args.out or ctx.name)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.broken:
        rows = measure_broken(out, [k for k in args.broken_kinds.split(",") if k], args.state_s)
        print(f"\n(wall time {time.monotonic() - t0:.0f} s)")
        if args.json:
            Path(args.json).write_text(json.dumps({"broken": rows}, indent=1))
        if ctx is not None:
            ctx.cleanup()
        return 0
    latency = [] if args.skip_latency else measure_latency(
        out, [s for s in args.styles.split(",") if s], args.per_style, args.canary_every)
    alarms = None if args.skip_false_alarms else measure_false_alarms(
        out, args.hours, args.compress, args.canary_every, args.seed)
    print(summarise(latency, alarms))
    print(f"\n(wall time {time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"latency": latency, "false_alarms": alarms}, indent=1))
    if ctx is not None:
        ctx.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
