"""The virtual-time oracle: matching, modifiers, GPU-hours, seeding, first hang wins."""

import numpy as np
import pytest

from soakmatrix.matrix.bisect.oracle import Probe
from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel, Modifier, load_hang_model

DEMO = {"mtp": 1, "cudagraph_mode": "FULL_AND_PIECEWISE", "async_scheduling": False, "tp": 2}


def test_matching_config_hangs_at_its_mttf_on_average(examples):
    model = load_hang_model(examples / "hangs" / "demo.yaml")
    oracle = VirtualOracle(model, "H200", startup_s=0.0, seed=1)
    results = oracle.run([Probe(DEMO, 1e9)] * 400)
    assert all(r.outcome == "hang" and r.signature == "shm_broadcast_timeout" for r in results)
    mean = np.mean([r.exposure_s for r in results])
    assert mean == pytest.approx(600, rel=0.15)


def test_non_matching_config_passes_for_the_whole_soak_and_pays_gpu_hours(examples):
    model = load_hang_model(examples / "hangs" / "demo.yaml")
    oracle = VirtualOracle(model, "H200", startup_s=600.0, seed=1)
    r = oracle.run([Probe({**DEMO, "mtp": 0}, 3600.0)])[0]
    assert r.outcome == "passed" and r.signature is None and r.exposure_s == 3600.0
    assert r.gpu_hours == pytest.approx(2 * (600 + 3600) / 3600)   # TP x (start-up + soak)


def test_modifier_and_gpu_and_concurrency_gates():
    hang = Hang("h", "silent_stall", {"mtp": (1,)}, 100.0, gpu=("H20",), min_running=4,
                modifiers=(Modifier({"flashinfer_autotune": (False,)}, 8.0),))
    model = HangModel(seed=0, hangs=(hang,))
    fast = VirtualOracle(model, "H20", startup_s=0, seed=2).run([Probe({"mtp": 1}, 1e9)] * 300)
    slow = VirtualOracle(model, "H20", startup_s=0, seed=2).run(
        [Probe({"mtp": 1, "flashinfer_autotune": False}, 1e9)] * 300)
    ratio = np.mean([r.exposure_s for r in slow]) / np.mean([r.exposure_s for r in fast])
    assert 6 < ratio < 10
    other_gpu = VirtualOracle(model, "H200", startup_s=0, seed=2).run([Probe({"mtp": 1}, 1000.0)])[0]
    assert other_gpu.outcome == "passed"
    calm = VirtualOracle(model, "H20", startup_s=0, seed=2, concurrency=2).run([Probe({"mtp": 1}, 1000.0)])[0]
    assert calm.outcome == "passed"


def test_seeded_runs_repeat_and_the_first_hang_wins():
    a = Hang("a", "silent_stall", {"mtp": (1,)}, 100.0)
    b = Hang("b", "crash", {"mtp": (1,)}, 100.0)
    model = HangModel(seed=5, hangs=(a, b))
    one = [r.exposure_s for r in VirtualOracle(model).run([Probe({"mtp": 1}, 1e9)] * 50)]
    two = [r.exposure_s for r in VirtualOracle(model).run([Probe({"mtp": 1}, 1e9)] * 50)]
    assert one == two
    results = VirtualOracle(model, seed=9).run([Probe({"mtp": 1}, 1e9)] * 200)
    ids = {r.extra["hang_id"] for r in results}
    assert ids == {"a", "b"}
    assert {r.outcome for r in results if r.extra["hang_id"] == "b"} == {"crash"}
    # two competing hangs of MTTF 100 end a probe after 50 on average
    assert np.mean([r.exposure_s for r in results]) == pytest.approx(50, rel=0.2)
