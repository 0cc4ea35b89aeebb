"""The restarting oracle: another signature restarts the server, the probe's load and GPU-hours add up,
other signatures are counted, and two bounds keep a config from restarting for ever."""

from __future__ import annotations

import numpy as np
import pytest

from soakmatrix.matrix.bisect import Element, Settings, bisect
from soakmatrix.matrix.bisect.oracle import Probe, ProbeResult
from soakmatrix.matrix.bisect.oracle_restart import RestartingOracle, other_signatures
from soakmatrix.matrix.bisect.policy import Policy
from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
from soakmatrix.matrix.bisect.report import render_text, to_json
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel

STARTUP = 600.0


class Scripted:
    """A fake inner oracle (like SoakOracle: one soak job per probe): each call hands out the next
    scripted (outcome, signature, load) per probe, a pass soaking the whole of what was asked."""

    def __init__(self, script):
        self.script = list(script)
        self.asked: list[list[Probe]] = []

    def run(self, probes):
        self.asked.append(list(probes))
        out = []
        for p in probes:
            outcome, sig, load = self.script.pop(0)
            load = p.soak_s if outcome == "passed" else load
            out.append(ProbeResult(p, outcome, sig, load, (STARTUP + load) / 3600.0, f"{outcome} after {load:.0f}s",
                                   {"cell_id": "c1", "node": "n1"}))
        return out


PROBE = Probe({"f0": True}, 3600.0, "failing cell")


def test_another_signature_restarts_until_the_soak_is_complete():
    inner = Scripted([("crash", "crash", 600.0), ("hang", "event_sync_stall", 900.0), ("passed", None, 0)])
    (r,) = RestartingOracle(inner, "shm_broadcast_timeout").run([PROBE])
    assert r.outcome == "passed" and r.signature is None
    assert [p.soak_s for (p,) in inner.asked] == [3600.0, 3000.0, 2100.0]      # the load still missing
    assert r.exposure_s == pytest.approx(3600.0)
    assert r.gpu_hours == pytest.approx((3 * STARTUP + 3600.0) / 3600.0)       # every start-up paid
    assert r.extra["restarts"] == 2 and r.extra["other_signatures"] == {"crash": 1, "event_sync_stall": 1}
    assert [p["outcome"] for p in r.extra["pieces"]] == ["crash", "hang", "passed"]


def test_the_target_hang_ends_the_probe_with_the_load_of_every_piece():
    inner = Scripted([("crash", "crash", 600.0), ("hang", "shm_broadcast_timeout", 200.0)])
    (r,) = RestartingOracle(inner, "shm_broadcast_timeout").run([PROBE])
    assert r.outcome == "hang" and r.signature == "shm_broadcast_timeout" and r.hung_with("shm_broadcast_timeout")
    assert r.exposure_s == pytest.approx(800.0) and r.extra["other_signatures"] == {"crash": 1}
    assert other_signatures([r], "shm_broadcast_timeout") == {"crash": 1}


def test_a_probe_without_another_signature_is_passed_through_unchanged():
    inner = Scripted([("hang", "shm_broadcast_timeout", 100.0), ("passed", None, 0)])
    plain = Scripted([("hang", "shm_broadcast_timeout", 100.0), ("passed", None, 0)])
    ours = RestartingOracle(inner, "shm_broadcast_timeout").run([PROBE, PROBE])
    assert ours == plain.run([PROBE, PROBE]) and len(inner.asked) == 1


def test_before_the_target_is_known_a_crash_restarts_and_any_hang_ends_the_probe():
    target = {"sig": None}
    oracle = RestartingOracle(Scripted([("crash", "crash", 50.0), ("hang", "event_sync_stall", 70.0)]),
                              lambda: target["sig"])
    (r,) = oracle.run([PROBE])
    assert r.outcome == "hang" and r.signature == "event_sync_stall" and r.exposure_s == pytest.approx(120.0)
    # once the search knows its target, the same hang of another signature restarts instead
    target["sig"] = "shm_broadcast_timeout"
    inner = Scripted([("hang", "event_sync_stall", 70.0), ("passed", None, 0)])
    oracle.inner = inner
    (r,) = oracle.run([PROBE])
    assert r.outcome == "passed" and r.extra["other_signatures"] == {"event_sync_stall": 1}


def test_continuations_of_a_batch_run_together():
    inner = Scripted([("crash", "crash", 100.0), ("passed", None, 0), ("crash", "crash", 300.0),
                      ("passed", None, 0), ("passed", None, 0)])
    a, b, c = (Probe({"f0": v}, 1000.0, str(v)) for v in (1, 2, 3))
    results = RestartingOracle(inner, "x").run([a, b, c])
    assert [len(batch) for batch in inner.asked] == [3, 2]
    assert [p.soak_s for p in inner.asked[1]] == [900.0, 700.0]
    assert [r.probe for r in results] == [a, b, c] and all(r.outcome == "passed" for r in results)
    assert [r.exposure_s for r in results] == [1000.0, 1000.0, 1000.0]


def test_a_config_that_crashes_on_every_start_is_a_config_error_not_a_loop():
    inner = Scripted([("crash", "crash", 0.0)] * 3 + [("passed", None, 0)])
    (r,) = RestartingOracle(inner, "shm_broadcast_timeout", policy=Policy(max_idle_starts=3)).run([PROBE])
    assert r.outcome == "config_error" and "3 starts in a row before any load" in r.message
    assert len(inner.asked) == 3 and r.extra["idle_starts"] == 3 and r.extra["other_signatures"] == {"crash": 3}
    assert r.gpu_hours == pytest.approx(3 * STARTUP / 3600.0)


def test_starts_with_load_in_between_are_not_idle():
    inner = Scripted([("crash", "crash", 0.0), ("crash", "crash", 0.0), ("crash", "crash", 50.0),
                      ("crash", "crash", 0.0), ("passed", None, 0)])
    (r,) = RestartingOracle(inner, "x", policy=Policy(max_idle_starts=3)).run([PROBE])
    assert r.outcome == "passed" and r.extra["restarts"] == 4


def test_after_max_restarts_the_probe_ends_with_the_other_signature_and_its_load():
    inner = Scripted([("crash", "crash", 100.0)] * 10)
    (r,) = RestartingOracle(inner, "shm_broadcast_timeout", policy=Policy(max_restarts=4)).run([PROBE])
    assert len(inner.asked) == 5 and r.extra["gave_up"] and "gave up after 4 restarts" in r.message
    assert r.outcome == "crash" and r.exposure_s == pytest.approx(500.0) and not r.hung_with("shm_broadcast_timeout")
    # the last crash ended the probe (the search counts it); the four before restarted it
    assert r.extra["other_signatures"] == {"crash": 4}
    assert other_signatures([r], "shm_broadcast_timeout") == {"crash": 5}


def test_errors_end_the_probe():
    inner = Scripted([("crash", "crash", 100.0), ("infra_error", None, 0.0)])
    (r,) = RestartingOracle(inner, "x").run([PROBE])
    assert r.outcome == "infra_error" and r.extra["restarts"] == 1


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        RestartingOracle(Scripted([]), "x", policy=Policy(max_idle_starts=0))


def _background(seed: int) -> VirtualOracle:
    model = HangModel(seed=1, hangs=(Hang("planted", "shm_broadcast", {"f1": (True,)}, 2280.0),
                                     Hang("background", "crash", {"f2": (True,)}, 600.0)))
    registry = {f"f{i}": flagmod.raw_flag(f"f{i}", "bool", ["--f{value}"], default=False) for i in range(3)}
    return VirtualOracle(model, seed=seed, startup_s=STARTUP, registry=registry, gpu_count=lambda f: 1)


def test_on_the_virtual_oracle_a_background_crash_leaves_the_target_rate_unbiased():
    oracle = RestartingOracle(_background(4), "shm_broadcast_timeout")
    results = oracle.run([Probe({"f0": True, "f1": True, "f2": True}, 1e9)] * 300)
    assert all(r.hung_with("shm_broadcast_timeout") for r in results)
    # the hang's MTTF (38 min) measured through restarts every ~10 min of load
    assert np.mean([r.exposure_s for r in results]) == pytest.approx(2280.0, rel=0.15)
    restarts = sum(r.extra.get("restarts", 0) for r in results)
    assert restarts == oracle.restarts and restarts / 300 == pytest.approx(2280.0 / 600.0, rel=0.2)


def test_bisection_with_a_background_crash_keeps_its_target_and_lists_the_crashes():
    elements = [Element(f"f{i}", True, False) for i in range(3)]
    r = bisect({"f0": True, "f1": True, "f2": True}, elements, _background(7), Settings(startup_s=STARTUP),
               gpu_count=lambda f: 1)
    assert r.status == "found" and r.signature == "shm_broadcast_timeout" and r.minimal == ["f1"]
    crashes = r.other_signatures["crash"]
    assert crashes > 5 and sum(cs.other_hangs for cs in r.configs) == crashes
    assert r.probes < 60 and any("restarted the server" in n for n in r.notes)
    text = render_text(r)
    assert f"other signatures (restarted probes, not counted): crash x{crashes}" in text
    assert "they restarted the server (the probe went on)" in text
    assert to_json(r)["other_signatures"] == {"crash": crashes}


def test_a_failing_cell_that_crashes_on_every_start_is_not_reproduced_with_the_reason():
    model = HangModel(seed=1, hangs=(Hang("planted", "shm_broadcast", {"f0": (True,)}, 2280.0),
                                     Hang("at-start", "crash", {"f0": (True,)}, 0.01)))
    registry = {"f0": flagmod.raw_flag("f0", "bool", ["--f{value}"], default=False)}
    oracle = VirtualOracle(model, seed=2, startup_s=STARTUP, registry=registry, gpu_count=lambda f: 1)
    r = bisect({"f0": True}, [Element("f0", True, False)], oracle, Settings(startup_s=STARTUP),
               signature="shm_broadcast_timeout", gpu_count=lambda f: 1)
    assert r.status == "not_reproduced" and r.probes == 1
    assert r.gpu_hours == pytest.approx(3 * STARTUP / 3600.0, rel=0.01)
    assert any("3 starts in a row before any load" in n for n in r.notes)
    assert r.other_signatures == {"crash": 3}
