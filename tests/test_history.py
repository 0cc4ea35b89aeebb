"""The history store: runs, planned cells, results written as cells finish, resume, migrations,
and a driver killed mid-run losing nothing it had recorded."""

from __future__ import annotations

import signal
import json
import sqlite3
import subprocess
import sys
import textwrap

import psutil
import pytest

from soakmatrix.matrix.cells import Cell
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports import history_schema
from soakmatrix.reports.history import HistoryStore, StoreError


def cell(tp: int, mtp: int = 0, gpu: str = "H200") -> Cell:
    return Cell.make("zai-org/GLM-5.1", gpu, {"tp": tp, "mtp": mtp}, "chat")


def planned_dict(c: Cell) -> dict:
    return {"id": c.id, "name": c.name, "model": c.model, "gpu": c.gpu, "flags": c.flag_dict, "workload": c.workload}


def result(c: Cell, outcome: str = "passed", **kw) -> CellResult:
    return CellResult(cell_id=c.id, cell_name=c.name, outcome=outcome, model=c.model, gpu_type=c.gpu,
                      workload=c.workload, flags=c.flag_dict, exposure_s=kw.pop("exposure_s", 600.0),
                      started_at=1000.0, ended_at=1700.0, gpu_count=c.tp, **kw)


def test_a_run_from_plan_to_finish(tmp_path):
    cells = [cell(2), cell(4, 1), cell(8, 2)]
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run = store.start_run(matrix="nightly.yaml", profile="nightly", meta={"git": "abc123"})
        store.planned(run, [planned_dict(c) for c in cells])
        store.record(run, result(cells[0]))
        store.record(run, result(cells[1], "hang", signature="shm_broadcast_timeout", time_to_hang_s=300.0,
                                 stuck_frames=["in _to_list"], log_tail=["<script>x</script>"]))
        [info] = store.runs()
        assert (info.id, info.matrix, info.profile, info.kind, info.meta) == (run, "nightly.yaml", "nightly", "nightly", {"git": "abc123"})
        assert (info.planned, info.recorded, info.finished) == (3, 2, False)
        assert store.finished_cell_ids(run) == {cells[0].id, cells[1].id}
        store.finish_run(run, "found")
        got = store.results(run)
        assert [r.cell_id for r in got] == [cells[0].id, cells[1].id]
        assert got[1].outcome is Outcome.HANG and got[1].log_tail == ["<script>x</script>"]
        assert got[1].to_dict() == result(cells[1], "hang", signature="shm_broadcast_timeout", time_to_hang_s=300.0,
                                          stuck_frames=["in _to_list"], log_tail=["<script>x</script>"]).to_dict()
        assert store.runs()[0].status == "found" and store.runs()[0].finished_at is not None
        assert store.planned_cell_ids(run) == [c.id for c in cells]
        assert store.cells()[cells[2].id].flags == {"mtp": 2, "tp": 8}


def test_a_later_record_replaces_the_earlier(tmp_path):
    c = cell(2)
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run = store.start_run(matrix="m", profile="p")
        store.record(run, result(c, "infra_error", message="node lost"))
        store.record(run, result(c, "passed", attempt=2, retries=["node lost"]))
        [only] = store.results(run)
        assert only.outcome is Outcome.PASSED and only.retries == ["node lost"]
        assert len(store.observations()) == 1


def test_resume_returns_the_unfinished_run_of_the_same_matrix_and_profile(tmp_path):
    path = tmp_path / "h.sqlite"
    with HistoryStore(path) as store:
        first = store.start_run(matrix="m.yaml", profile="nightly")
        other = store.start_run(matrix="m.yaml", profile="smoke")
    with HistoryStore(path) as store:
        assert store.start_run(matrix="m.yaml", profile="nightly", resume=True) == first
        assert store.start_run(matrix="m.yaml", profile="smoke", resume=True) == other
        store.finish_run(first, "passed")
        fresh = store.start_run(matrix="m.yaml", profile="nightly", resume=True)
        assert fresh not in (first, other)
        assert store.start_run(matrix="m.yaml", profile="nightly") != fresh   # without resume: always new
        assert [r.id for r in store.runs()][:3] == [first, other, fresh]


def test_bisections_round_trip(tmp_path):
    report = {"cell": "abc", "signature": "shm_broadcast_timeout", "minimal_set": {"mtp": 2, "tp": 8},
              "confidence": 0.95, "gpu_hours": 41.5,
              "configs": [{"flags": {"mtp": 2}, "hangs": 3, "exposure_s": 6840.0, "mttf_s": 2280.0, "ci": [1000.0, 9000.0]}],
              "verdicts": {"mtp": "needed: MTP off never hung in 6.1 h", "flashinfer_autotune": "modifier: MTTF x8"}}
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run = store.start_run(matrix="m", profile="p")
        store.record_bisection("abc", report, run_id=run)
        store.record_bisection("def", {**report, "cell": "def"})
        got = store.bisections()
    assert [b["cell_id"] for b in got] == ["abc", "def"]
    assert got[0]["run_id"] == run and got[1]["run_id"] is None
    assert got[0]["verdicts"] == report["verdicts"] and got[0]["configs"] == report["configs"]


def test_the_same_bisection_report_twice_is_stored_once(tmp_path):
    # `bisect --resume` of a finished bisection replays it to the very same report
    report = {"cell": "abc", "signature": "shm_broadcast_timeout", "minimal": ["mtp"], "gpu_hours": 41.5}
    with HistoryStore(tmp_path / "h.sqlite") as store:
        store.record_bisection("abc", report)
        store.record_bisection("abc", dict(report))
        store.record_bisection("def", dict(report))                        # another cell's is its own
        store.record_bisection("abc", {**report, "gpu_hours": 45.0})       # a bisection that went on
        got = store.bisections()
    assert [(b["cell_id"], b["gpu_hours"]) for b in got] == [("abc", 41.5), ("def", 41.5), ("abc", 45.0)]


def test_unknown_run_is_a_clear_error(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as store:
        with pytest.raises(KeyError, match="no run 'nope'"):
            store.record("nope", result(cell(2)))


def test_migrates_an_old_store_and_keeps_its_data(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(history_schema.MIGRATIONS[1])   # a store written by the first schema
    c = cell(4, 1)
    r = result(c, "hang", signature="silent_stall", detector="token_progress")
    db.execute("INSERT INTO runs (id, matrix, profile, kind, started_at) VALUES ('r1', 'm', 'p', 'nightly', 1.0)")
    db.execute("INSERT INTO cells VALUES (?,?,?,?,?,?)", (c.id, c.name, c.model, c.gpu, '{"tp": 4, "mtp": 1}', c.workload))
    db.execute("INSERT INTO results (run_id, cell_id, outcome, signature, exposure_s, started_at, ended_at, data, recorded_at) "
               "VALUES ('r1', ?, 'hang', 'silent_stall', 600.0, 1000.0, 1700.0, ?, 2.0)", (c.id, r.to_json()))
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with HistoryStore(path) as store:
        assert store.schema_version == history_schema.SCHEMA_VERSION >= 3
        [ob] = store.observations()
        assert ob.detector == "token_progress"                 # back-filled by migration 3
        assert ob.gpu_hours == pytest.approx(4 * 700 / 3600)
        store.record_bisection(c.id, {"signature": "silent_stall"})   # table added by migration 2
        assert store.results("r1")[0].signature == "silent_stall"


def test_results_written_with_a_free_form_extra_dict_load_into_the_named_fields(tmp_path):
    c = cell(2)
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run_id = store.start_run(matrix="m", profile="p", kind="nightly")
        store.record(run_id, result(c, "hang", signature="silent_stall"))
    old = result(c, "hang", signature="silent_stall").to_dict()
    for name in ("ray_node_id", "preflight", "stalls", "time_scale"):
        del old[name]
    old["extra"] = {"ray_node_id": "node-a", "preflight": {"ok": True}, "stalls": [{"at": 1.0}], "time_scale": 60.0,
                    "a_key_nobody_names": 1}
    db = sqlite3.connect(tmp_path / "h.sqlite")
    db.execute("UPDATE results SET data = ?", (json.dumps(old),))
    db.commit()
    db.close()
    with HistoryStore(tmp_path / "h.sqlite") as store:
        [r] = store.results(run_id)
    assert (r.ray_node_id, r.preflight, r.stalls, r.time_scale) == ("node-a", {"ok": True}, [{"at": 1.0}], 60.0)
    assert "extra" not in r.to_dict() and "a_key_nobody_names" not in r.to_json()


def test_refuses_newer_schemas_and_foreign_files(tmp_path):
    newer = tmp_path / "newer.sqlite"
    HistoryStore(newer).close()
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {history_schema.SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match=r"newer.sqlite: schema version \d+ is newer"):
        HistoryStore(newer)
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some words that fill the header page......" * 20)
    with pytest.raises(StoreError, match="notes.txt: not a soakmatrix history store"):
        HistoryStore(text)
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="other.sqlite: an SQLite file, but not a soakmatrix"):
        HistoryStore(other)
    with pytest.raises(StoreError, match="no such history store"):
        HistoryStore(tmp_path / "missing.sqlite", create=False)


DRIVER = textwrap.dedent("""
    import sys, time
    from soakmatrix.matrix.contracts.result import CellResult
    from soakmatrix.reports.history import HistoryStore
    store = HistoryStore(sys.argv[1])
    run = store.start_run(matrix="m.yaml", profile="nightly", resume=True)
    done = store.finished_cell_ids(run)
    for i in range(10_000):
        cid = f"cell{i:05d}"
        if cid in done:
            continue
        store.record(run, CellResult(cell_id=cid, cell_name=f"m|H200|tp={i}|chat", outcome="passed",
                                     model="m", gpu_type="H200", exposure_s=1.0, log_tail=["x" * 2000] * 20))
        print(cid, flush=True)
        time.sleep(0.002)
""")


def test_a_driver_killed_mid_run_loses_nothing_it_recorded(tmp_path):
    path = tmp_path / "h.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        printed = [proc.stdout.readline().strip() for _ in range(40)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    with HistoryStore(path) as store:
        [run] = store.runs()
        assert not run.finished
        done = store.finished_cell_ids(run.id)
        assert set(printed) <= done                       # every cell it said it recorded is there
        assert all(len(r.log_tail) == 20 for r in store.results(run.id))   # and whole
        assert store.start_run(matrix="m.yaml", profile="nightly", resume=True) == run.id
