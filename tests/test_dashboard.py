"""The dashboard: built from a realistic synthetic history, checked as HTML and opened in headless
Chromium (Debian's `chromium`) over the DevTools protocol: figures drawn, tables filled, no console
errors, no network, hostile log lines shown as text, and a screenshot taken.

Set SOAKMATRIX_SCREENSHOT=path.png to keep the screenshot for a look.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from soakmatrix.matrix.cells import Cell
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.dashboard import build_dashboard
from soakmatrix.reports.history import HistoryStore, StoreError

T0 = 1_790_000_000.0
NIGHT = 86_400.0
HOSTILE = ('</pre></script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
           ' & EngineCore <b>bold</b>')
FRAMES = ['File "vllm/v1/worker/gpu_model_runner.py", line 2410, in _to_list',
          "    self.transfer_event.synchronize()"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio"]

# (model, gpu, flags) -> one letter per night: P passed, H hang, C crash, X config error, I infra error
PATTERNS = {
    ("zai-org/GLM-5.1", "H200", (("mtp", 2), ("tp", 8))): "HHHH",      # consistently failing
    ("zai-org/GLM-5.1", "H200", (("mtp", 0), ("tp", 8))): "PPPP",      # passing
    ("zai-org/GLM-5.1", "H20", (("mtp", 1), ("tp", 4))): "PHPH",       # flaky
    ("zai-org/GLM-5.1", "H20", (("mtp", 0), ("tp", 4))): "PPIP",       # passing despite an infra error
    ("Qwen/Qwen3-0.6B", "H200", (("mtp", 0), ("tp", 1))): "PPPC",      # new crash tonight
    ("Qwen/Qwen3-0.6B", "H200", (("mtp", 2), ("tp", 1))): "XXXX",      # engine refuses the flags
    ("Qwen/Qwen3-0.6B", "GeForce-RTX-5090", (("mtp", 0), ("tp", 1))): "PPHH",   # regression
}
OUTCOMES = {"P": "passed", "H": "hang", "C": "crash", "X": "config_error", "I": "infra_error"}


def night_result(cell: Cell, letter: str, night: int) -> CellResult:
    started = T0 + night * NIGHT
    kw: dict = dict(cell_id=cell.id, cell_name=cell.name, outcome=OUTCOMES[letter], model=cell.model, gpu_type=cell.gpu,
                    workload=cell.workload, flags=cell.flag_dict, node=f"node-{night}", gpu_count=cell.tp,
                    engine="vllm", vllm_version="0.33.0", started_at=started, exposure_s=7200.0,
                    ended_at=started + 7300)
    if letter == "H":
        signature = "shm_broadcast_timeout" if cell.flag_dict["mtp"] else "event_sync_stall"
        kw.update(signature=signature, detector="token_progress", time_to_hang_s=1800.0 + 600 * night,
                  exposure_s=1800.0 + 600 * night, stuck_frames=FRAMES,
                  message=f"generation_tokens_total flat for 60 s with 15 requests running, {30 + 10 * night} min in",
                  log_tail=["No available shared memory broadcast block found in 60 seconds.", HOSTILE])
    elif letter == "C":
        kw.update(signature="cuda_illegal_address", detector="process_exit", exposure_s=900.0,
                  message="engine exited with code 1", log_tail=["RuntimeError: CUDA error: illegal memory access", HOSTILE])
    elif letter == "X":
        kw.update(exposure_s=0.0, message="num_speculative_tokens=2 refused: " + HOSTILE)
    elif letter == "I":
        kw.update(exposure_s=0.0, attempt=3, message="node lost", retries=["port 8000 taken", "GPU busy"])
    return CellResult(**kw)


def make_store(path: Path, nights: int = 4) -> tuple[Path, dict[str, Cell]]:
    cells = {}
    clock = [T0]
    with HistoryStore(path, clock=lambda: clock[0]) as store:
        for night in range(nights):
            clock[0] = T0 + night * NIGHT
            run = store.start_run(matrix="matrix/examples/nightly.yaml", profile="nightly", meta={"git": f"abc{night}"})
            for (model, gpu, flags), pattern in PATTERNS.items():
                cell = Cell.make(model, gpu, dict(flags), "chat-multiturn")
                cells[pattern] = cell
                store.planned(run, [{"id": cell.id, "name": cell.name, "model": model, "gpu": gpu,
                                     "flags": cell.flag_dict, "workload": cell.workload}])
                store.record(run, night_result(cell, pattern[night], night))
            clock[0] += 7400
            store.finish_run(run, "found")
        store.record_bisection(cells["HHHH"].id, {
            "cell": cells["HHHH"].id, "signature": "shm_broadcast_timeout",
            "minimal_set": {"mtp": 2, "tp": 8}, "confidence": 0.95, "gpu_hours": 41.5,
            "configs": [{"flags": {"mtp": 2, "tp": 8}, "hangs": 3, "exposure_s": 6840.0, "mttf_s": 2280.0, "ci": [900.0, 9000.0]},
                        {"flags": {"mtp": 0, "tp": 8}, "hangs": 0, "exposure_s": 21600.0, "mttf_s": None, "ci": [7200.0, None]}],
            "verdicts": {"mtp": "needed: MTP off never hung in 6 h", "tp": "needed: tp=4 never hung",
                         "flashinfer_autotune": "modifier <x8>: " + HOSTILE}})
        # as `soakmatrix bisect --json` spells it (matrix/bisect/report.py's to_json): minimal_flags
        # is the whole minimal config, the set is the flags `minimal` names
        flaky = cells["PHPH"]
        store.record_bisection(flaky.id, {
            "status": "found", "signature": "shm_broadcast_timeout", "confidence": 0.95, "posterior": 0.991,
            "cell": {"id": flaky.id, "name": flaky.name}, "minimal": ["mtp"], "minimal_flags": {"mtp": 1, "tp": 4},
            "certified_soak_s": 10800.0, "gpu_hours": 12.25, "probes": 9,
            "failing": {"hangs": 2, "exposure_s": 5000.0, "mttf_s": 2500.0, "low_s": 700.0, "high_s": 20000.0, "confidence": 0.95},
            "verdicts": [{"flag": "mtp", "kind": "needed", "text": "mtp=0 never hung in 9 h", "ratio": None, "p_value": 0.001},
                         {"flag": "tp", "kind": "irrelevant", "text": "tp=1 hung as often", "ratio": 1.1, "p_value": 0.8}],
            "configs": [{"label": "failing cell", "role": "calibration", "flags": {"mtp": 1, "tp": 4}, "probes": 2, "hangs": 2,
                         "other_hangs": 0, "exposure_s": 5000.0, "gpu_hours": 5.5, "mttf": "41.7m (95% CI 11.7m-5.6h)"},
                        {"label": "mtp=0", "role": "probe", "flags": {"mtp": 0, "tp": 4}, "probes": 3, "hangs": 0,
                         "other_hangs": 0, "exposure_s": 32400.0, "gpu_hours": 4.0, "mttf": "> 3h at 95%"},
                        {"label": "tp=1", "role": "probe", "flags": {"mtp": 1, "tp": 1}, "probes": 4, "hangs": 3,
                         "other_hangs": 0, "exposure_s": 6000.0, "gpu_hours": 2.75, "mttf": "33m (95% CI 11m-2h)"}]})
        # an unfinished run at the end, as a driver killed mid-run leaves it
        clock[0] = T0 + nights * NIGHT
        store.start_run(matrix="matrix/examples/nightly.yaml", profile="nightly")
    return path, cells


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, dict[str, Cell]]:
    where = tmp_path_factory.mktemp("dash")
    store, cells = make_store(where / "history.sqlite")
    return build_dashboard(store, where / "site"), cells


# -- the HTML itself --------------------------------------------------------------------------------

def test_page_is_self_contained_with_plotly_inlined_once(site):
    from plotly.offline import get_plotlyjs
    page, _ = site
    text = page.read_text()
    assert text.count(get_plotlyjs()[:400]) == 1
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", text, flags=re.S)
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', markup)     # nothing fetched from anywhere
    assert not re.search(r"<link[^>]+stylesheet", markup)
    assert markup.count("<script") == 5                  # plotly, the page's script, three figures
    assert list(page.parent.iterdir()) == [page]


def test_log_lines_are_escaped_everywhere(site):
    page, _ = site
    text = page.read_text()
    assert "window.__pwned" in text                       # the hostile line is on the page...
    assert "<script>window.__pwned" not in text           # ...but never as markup
    assert "<img src=x" not in text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in text
    # inside JSON script blocks no "</script" can appear
    for block in re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', text, re.S):
        assert "<" not in block
        json.loads(block)


def test_page_holds_signatures_bisections_and_runs(site):
    page, cells = site
    text = page.read_text()
    for signature in ("shm_broadcast_timeout", "event_sync_stall", "cuda_illegal_address"):
        assert signature in text
    assert "in _to_list" in text and "needed: MTP off never hung in 6 h" in text
    assert "41.5 GPU-hours" in text and "mtp=2,tp=8" in text
    # the bisect CLI's own JSON spelling renders too
    assert "12.25 GPU-hours" in text and "posterior 0.991" in text and "needed: mtp=0 never hung in 9 h" in text
    assert "smallest flag set that still hangs: <b>mtp=1</b>" in text and "certified soak 3h" in text
    runs_table = text[text.index('id="runs-table"'):]
    runs_table = runs_table[:runs_table.index("</table>")]
    assert runs_table.count("<tr><td") == 5 and runs_table.count("running / unfinished") == 1


def test_missing_store_is_an_error_not_an_empty_page(tmp_path):
    with pytest.raises(StoreError, match="no such history store"):
        build_dashboard(tmp_path / "nope.sqlite", tmp_path / "site")
    assert not (tmp_path / "nope.sqlite").exists()


def test_empty_store_still_builds(tmp_path):
    HistoryStore(tmp_path / "h.sqlite").close()
    page = build_dashboard(tmp_path / "h.sqlite", tmp_path / "site")
    assert "No hang or crash recorded." in page.read_text()


# -- in a browser ---------------------------------------------------------------------------------

PROBE = """(() => {
  const q = (s) => document.querySelectorAll(s);
  const text = (s) => Array.from(q(s)).map(e => e.textContent).join("\\n");
  return {
    drawn: document.body.dataset.figuresDrawn || null,
    heatmapImages: q("#heatmap .heatmaplayer image").length,
    historyImages: q("#history .heatmaplayer image").length,
    heatmapRows: Array.from(q("#heatmap .yaxislayer-above .ytick text")).map(e => e.textContent),
    runBars: q("#runs-figure .barlayer .point").length,
    attentionRows: q("#attention-table tbody tr").length,
    attentionText: text("#attention-table tbody"),
    runRows: q("#runs-table tbody tr").length,
    signatures: q("#signatures .sig").length,
    bisectConfigRows: q(".bisect-configs tbody tr").length,
    bisectVerdictRows: q(".bisect-verdicts tbody tr").length,
    logText: text("#signatures pre.log"),
    verdictText: text(".bisect-verdicts"),
    pwned: window.__pwned === undefined ? null : window.__pwned,
    injectedImages: q("img").length,
    scripts: q("script").length,
    pageHeight: document.documentElement.scrollHeight,
  };
})()"""


class DevTools:
    """The few DevTools-protocol calls the test needs, over aiohttp's websocket client."""

    def __init__(self, ws):
        self.ws, self.ids, self.events, self.waiting = ws, itertools.count(1), [], {}

    async def pump(self):
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def call(self, method: str, **params):
        call_id = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = fut
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, 60)
        assert "error" not in reply, reply
        return reply["result"]

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")


async def inspect_page(url: str, devtools_port: int, screenshot: Path) -> tuple[dict, list[dict]]:
    import aiohttp
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as resp:
                    pages = [t for t in await resp.json() if t["type"] == "page"]
                if pages:
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = DevTools(ws)
            pump = asyncio.create_task(cdp.pump())
            for domain in ("Runtime", "Log", "Page", "Network"):
                await cdp.call(f"{domain}.enable")
            await cdp.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
            await cdp.call("Page.navigate", url=url)
            deadline = time.monotonic() + 120
            probe = None
            while time.monotonic() < deadline:
                probe = await cdp.evaluate(PROBE)
                if probe and probe["drawn"]:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(0.5)   # let plotly finish its layout pass
            probe = await cdp.evaluate(PROBE)
            shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            import base64
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            pump.cancel()
            return probe, cdp.events


def problems(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('exception', {}).get('description') or p['exceptionDetails']}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            out.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
        elif m == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            out.append(f"log {p['entry']['level']}: {p['entry']['text']} ({p['entry'].get('url', '')})")
    return out


def requests_made(events: list[dict]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]


@pytest.mark.slow
def test_dashboard_in_headless_chromium(site, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (`make chromium` installs it)")
    page, cells = site
    profile = tmp_path / "profile"
    proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "--remote-debugging-address=127.0.0.1", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    screenshot = tmp_path / "dashboard.png"
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None, "chromium exited at start-up"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        probe, events = asyncio.run(asyncio.wait_for(inspect_page(page.as_uri(), port, screenshot), 300))
    finally:
        family = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # renderer and zygote processes leave a moment after the browser; stragglers get SIGKILL
        _, stragglers = psutil.wait_procs(family, timeout=30)
        for p in stragglers:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        _, left = psutil.wait_procs(stragglers, timeout=30)
    if os.environ.get("SOAKMATRIX_SCREENSHOT"):
        shutil.copy(screenshot, os.environ["SOAKMATRIX_SCREENSHOT"])

    assert problems(events) == []
    assert all(u.startswith(("file:", "data:")) for u in requests_made(events)), requests_made(events)
    assert probe["drawn"] == "3"                                  # heatmap, status history, runs chart
    assert probe["heatmapImages"] == 1 and probe["historyImages"] == 1
    assert sorted(probe["heatmapRows"]) == ["Qwen/Qwen3-0.6B · GeForce-RTX-5090", "Qwen/Qwen3-0.6B · H200",
                                            "zai-org/GLM-5.1 · H20", "zai-org/GLM-5.1 · H200"]
    assert probe["runBars"] >= 4
    assert probe["attentionRows"] == 5                            # every cell but the two passing ones
    assert "consistently failing" in probe["attentionText"] and "flaky" in probe["attentionText"]
    assert probe["runRows"] == 5 and probe["signatures"] == 3
    assert probe["bisectConfigRows"] == 2 + 3 and probe["bisectVerdictRows"] == 3 + 2   # both report spellings
    # the hostile log line shows as text, and nothing in it ran
    assert "<script>window.__pwned = 1</script>" in probe["logText"]
    assert "<img src=x" in probe["verdictText"]
    assert probe["pwned"] is None and probe["injectedImages"] == 0 and probe["scripts"] == 5
    # the screenshot is a real rendering of the whole page
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width == 1400 and height >= probe["pageHeight"] - 2 and len(png) > 50_000
    assert left == []      # nothing of chromium's survives the test


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_one_noisy_cell_cannot_bloat_the_page(tmp_path):
    cell = Cell.make("m", "H200", {"tp": 1}, "chat")
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run = store.start_run(matrix="m", profile="p")
        store.record(run, CellResult(cell_id=cell.id, cell_name=cell.name, outcome="hang", model="m", gpu_type="H200",
                                     flags=cell.flag_dict, signature="silent_stall", exposure_s=60.0,
                                     log_tail=["y" * 1_000_000] + ["z" * 300] * 10_000, stuck_frames=["f" * 50_000] * 100))
    quiet = tmp_path / "quiet.sqlite"
    HistoryStore(quiet).close()
    noisy_size = build_dashboard(tmp_path / "h.sqlite", tmp_path / "noisy").stat().st_size
    quiet_size = build_dashboard(quiet, tmp_path / "quiet").stat().st_size
    assert noisy_size - quiet_size < 200_000


def test_headline_numbers_keep_two_significant_digits_below_ten():
    from soakmatrix.reports.dashboard import amount_text
    assert [amount_text(x) for x in (0.0, 0.004, 0.1412, 2.46, 12.4, 1234.6)] == \
        ["0", "<0.01", "0.14", "2.5", "12", "1235"]


def _store_passes(path, passes, profile="nightly"):
    """A store with one run of passed cells: (engine, GPU type, seconds of wall, seconds of load) each."""
    with HistoryStore(path) as store:
        run = store.start_run(matrix="m.yaml", profile=profile)
        for engine, gpu, wall, load in passes:
            cell = Cell.make("org/m", gpu, {"mtp": 1}, "steady")
            store.planned(run, [{"id": cell.id, "name": cell.name, "model": "org/m", "gpu": gpu,
                                 "flags": cell.flag_dict, "workload": "steady"}])
            store.record(run, CellResult(cell_id=cell.id, cell_name=cell.name, outcome="passed", model="org/m",
                                         gpu_type=gpu, workload="steady", flags=cell.flag_dict, gpu_count=1,
                                         engine=engine, started_at=T0, ended_at=T0 + wall, exposure_s=load))
        store.finish_run(run, "passed")
    return path


def test_a_short_run_shows_its_gpu_hours_not_zero(tmp_path):
    store = _store_passes(tmp_path / "history.sqlite", [("sim", "H200", 500.0, 420.0)], profile="smoke")
    text = build_dashboard(store, tmp_path / "site").read_text()
    gpu_card = re.search(r'<div class="n">([^<]*)</div><div class="l">GPU-hours</div>', text)
    load_card = re.search(r'<div class="n">([^<]*)</div><div class="l">hours under load</div>', text)
    assert load_card and load_card.group(1) == "0.12"          # 420 s of load
    assert gpu_card and gpu_card.group(1) == "0.14"            # 500 s on one GPU, not "0"
    # the simulated engine's load is on its own (faster) clock: said beside the number
    assert "all\n      on the simulated engine's clock" in text


def test_hours_under_load_say_how_much_was_simulated(tmp_path):
    mixed = _store_passes(tmp_path / "history.sqlite", [("sim", "H200", 3 * 3600.0, 3 * 3600.0),
                                                       ("vllm", "H20", 9 * 3600.0, 9 * 3600.0)])
    text = build_dashboard(mixed, tmp_path / "site").read_text()
    assert re.search(r'<div class="n">12</div><div class="l">hours under load</div>\s*<div class="sub">3.0\s+'
                     r"on the simulated engine's clock", text)
    real = _store_passes(tmp_path / "real.sqlite", [("vllm", "H20", 3600.0, 3600.0)])
    assert "simulated engine" not in build_dashboard(real, tmp_path / "real-site").read_text()
