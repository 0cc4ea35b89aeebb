"""History as free exposure: the failing cell's recorded hangs and load enter its calibration, through the
library with fake records and once through the CLI with a real store."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from soakmatrix.matrix.bisect import Element, Policy, Settings, bisect
from soakmatrix.matrix.bisect.history_exposure import HistoryExposure, calibration_saved, history_exposure
from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel
from soakmatrix.matrix.contracts.outcomes import Outcome
from tests.test_bisect_cli import DEMO, FAILING, _cell_id, soakmatrix

SIG = "shm_broadcast_timeout"

CELL_FIRST_HANGS = Policy().cell_first_hangs


@dataclass(frozen=True)
class Rec:
    run_id: str
    cell_id: str
    outcome: Outcome
    signature: str | None
    exposure_s: float
    time_to_hang_s: float | None = None


def test_the_cells_hangs_of_the_target_and_all_its_load_count():
    recs = [Rec("r1", "c", Outcome.HANG, SIG, 900.0, 600.0),            # load up to the hang
            Rec("r1", "other", Outcome.HANG, SIG, 100.0, 100.0),        # another cell (another build)
            Rec("r2", "c", Outcome.CRASH, "crash", 300.0, 300.0),       # another signature: its load counts
            Rec("r2", "c", Outcome.PASSED, None, 2700.0),
            Rec("r3", "c", Outcome.INFRA_ERROR, None, 500.0),           # errors carry no load
            Rec("r3", "c", Outcome.HANG, "event_sync_stall", 0.0, 400.0),
            Rec("r4", "c", Outcome.HANG, SIG, 0.0, None)]               # no load on record: says nothing
    h = history_exposure(recs, "c", SIG)
    assert h == HistoryExposure(SIG, 1, 600.0 + 300.0 + 2700.0 + 400.0, 4, ("r1", "r2", "r3"))
    assert history_exposure(recs, "c", None) is None and history_exposure(recs, "nope", SIG) is None


def test_what_the_history_saved_is_the_calibration_hangs_it_gave_at_their_mttf():
    h = HistoryExposure(SIG, 3, 3 * 2280.0, 5, ("r1",))
    assert calibration_saved(h, 2, 2, 600.0) == pytest.approx(2 * 2 * (600.0 + 2280.0) / 3600.0)
    assert calibration_saved(HistoryExposure(SIG, 1, 2280.0, 1, ("r1",)), 2, 1, 600.0) == pytest.approx(2880 / 3600)
    assert calibration_saved(HistoryExposure(SIG, 0, 9000.0, 2, ("r1",)), 2, 1, 600.0) == 0.0


def _run(seed: int, history: HistoryExposure | None):
    model = HangModel(seed=1, hangs=(Hang("planted", "shm_broadcast", {"f1": (True,), "f3": (True,)}, 2280.0),))
    registry = {f"f{i}": flagmod.raw_flag(f"f{i}", "bool", ["--f{value}"], default=False) for i in range(5)}
    oracle = VirtualOracle(model, seed=seed, startup_s=600.0, registry=registry, gpu_count=lambda f: 1)
    return bisect({f"f{i}": True for i in range(5)}, [Element(f"f{i}", True, False) for i in range(5)], oracle,
                  Settings(startup_s=600.0), gpu_count=lambda f: 1, history=history)


def _cell(r):
    return next(cs for cs in r.configs if cs.label == "failing cell")


def test_history_replaces_the_calibration_and_gives_the_same_answer_for_fewer_gpu_hours():
    # twelve recorded hangs: as many as the failing cell is soaked for when the modifier verdicts'
    # groups do not clear (calibration, the ablation's reference, the modifiers' comparison), so not
    # one probe of it
    history = HistoryExposure(SIG, 12, 12 * 2280.0, 14, ("n1", "n2", "n3"))
    without = [_run(seed, None) for seed in range(12)]
    with_ = [_run(seed, history) for seed in range(12)]
    assert all(r.status == "found" and r.minimal == ["f1", "f3"] for r in without + with_)
    assert all(r.signature == SIG and r.signature_source == "the history store" for r in with_)
    assert all("calibration" in r.gpu_hours_by_role and _cell(r).probes >= CELL_FIRST_HANGS for r in without)
    assert all(_cell(r).probes == 0 and _cell(r).hangs == 12 for r in with_)
    assert not any("calibration" in r.gpu_hours_by_role for r in with_)
    saved = np.mean([r.gpu_hours for r in without]) - np.mean([r.gpu_hours for r in with_])
    # the estimate, a lower one: the 8 hangs every run soaks the failing cell for, 8 x (10 min + 38
    # min) = 6.4 GPU-hours; what the runs show is of that order
    assert saved > 5.0
    note = next(n for n in with_[0].notes if n.startswith("history:"))
    assert "12 hang(s) of shm_broadcast_timeout" in note and "spared ~6.4 GPU-hours of soaking the failing cell" in note
    assert "(8 of the 8 hang(s) it is soaked for at least" in note


def test_a_few_recorded_hangs_leave_the_rest_to_soak_for():
    runs = [_run(seed, HistoryExposure(SIG, 2, 2 * 2280.0, 2, ("n1",))) for seed in range(8)]
    plain = [_run(seed, None) for seed in range(8)]
    assert all(r.status == "found" and r.minimal == ["f1", "f3"] for r in runs)
    assert all(_cell(r).hangs >= CELL_FIRST_HANGS and _cell(r).probes > 0 for r in runs)
    assert any("6 more were soaked for" in n for n in runs[0].notes)
    assert np.mean([_cell(r).gpu_hours for r in runs]) < np.mean([_cell(r).gpu_hours for r in plain])


def test_history_of_another_signature_than_the_target_is_refused():
    with pytest.raises(ValueError, match="history is for"):
        model = HangModel(seed=1, hangs=())
        bisect({"f0": True}, [Element("f0", True, False)], VirtualOracle(model, seed=1), signature="crash",
               history=HistoryExposure(SIG, 1, 100.0, 1, ("n1",)))


@pytest.mark.slow   # the CLI as a subprocess
def test_cli_bisect_with_the_nightlys_results_in_the_store_spends_less_for_the_same_answer(tmp_path):
    from soakmatrix.matrix.contracts.result import CellResult
    from soakmatrix.reports.history import HistoryStore

    store = tmp_path / "history.sqlite"
    cell = _cell_id()
    nights = [("hang", SIG, load) for load in (500, 700, 300, 800, 400, 650, 550, 900, 450, 600, 750, 350)]
    # the rest as the demo's hang model makes them: the other planted hang cuts a soak short now and then
    nights += [("passed", None, 150), ("hang", "event_sync_stall", 400), ("infra_error", None, 0)]
    with HistoryStore(store) as history:
        for outcome, sig, load in nights:
            run = history.start_run(matrix="demo", profile="demo")
            history.record(run, CellResult(cell_id=cell, cell_name=FAILING, outcome=outcome, signature=sig,
                                           exposure_s=float(load), time_to_hang_s=None if sig is None else float(load)))
        other = history.start_run(matrix="demo", profile="demo")
        history.record(other, CellResult(cell_id="another-cell", cell_name="x", outcome="hang", signature=SIG,
                                         exposure_s=10.0, time_to_hang_s=10.0))
    args = ("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--quiet", "--no-shrink",
            "--signature", SIG)
    docs = []
    for seed in ("1", "2", "3"):
        plain = soakmatrix(*args, "--seed", seed)
        stored = soakmatrix(*args, "--seed", seed, "--store", str(store))
        assert plain.returncode == stored.returncode == 1, plain.stderr + stored.stderr
        docs.append((json.loads(plain.stdout), json.loads(stored.stdout)))
    for plain, stored in docs:
        assert "history" not in plain
        assert sorted(stored["minimal"]) == sorted(plain["minimal"]) == ["cudagraph_mode", "mtp"]
        assert stored["history"]["hangs"] == 12 and stored["history"]["results"] == 14
        assert stored["history"]["exposure_s"] == 6950.0 + 150.0 + 400.0
        assert stored["history"]["saved_gpu_hours_estimate"] > 0
        assert any(n.startswith("history: 12 hang(s)") for n in stored["notes"])
        cells = [next(c for c in doc["configs"] if c["label"] == "failing cell") for doc in (plain, stored)]
        assert cells[0]["probes"] >= CELL_FIRST_HANGS and cells[1]["probes"] == 0
    assert sum(s["gpu_hours"] for _, s in docs) < sum(p["gpu_hours"] for p, _ in docs)
