"""One finding per bug: results grouped by fingerprint across cells and nights, with pooled MTTF."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.findings import findings, role_sections
from soakmatrix.reports.history import HistoryStore
from soakmatrix.reports.known_issues import load_known_issues

EXAMPLE = Path(__file__).resolve().parent.parent / "matrix" / "examples" / "known_issues.yaml"
T0 = 1_790_000_000.0
THREADS = [{"role": "EngineCore", "thread": "MainThread", "kind": "culprit", "reason": "sleep in engine code",
            "frames": ["_park_forever (fault_plugin.py:171)", "schedule (fault_plugin.py:279)"]},
           {"role": "Worker", "thread": "MainThread", "kind": "victim", "reason": "shm_broadcast wait",
            "frames": ["acquire_read (shm_broadcast.py:864)"]}]


def result(cell: str, night: int, outcome: str = "passed", fp: str | None = None, **kw) -> CellResult:
    flags = {"a": {"c1": 1, "c2": 2, "c3": 3}[cell], "prefix_caching": True, "kv_cache_dtype": "fp8"}
    hung = outcome == "hang"
    return CellResult(cell_id=cell, cell_name=f"cell-{cell}", outcome=outcome, flags=flags, exposure_s=3600.0,
                      time_to_hang_s=1800.0 if hung else None, fingerprint=fp, signature="silent_stall" if hung else None,
                      started_at=T0 + night * 86400, stuck_frames=THREADS[0]["frames"] if hung else [],
                      culprit="EngineCore MainThread: sleep in engine code" if hung else "",
                      threads=THREADS if hung else [], gpu_state={"measured": True, "state": "idle"} if hung else {},
                      **kw)


@pytest.fixture
def store(tmp_path):
    nights = [  # (cell, outcome, fingerprint) per night
        [("c1", "hang", "aaaa11112222"), ("c2", "passed", None), ("c3", "passed", None)],
        [("c1", "passed", None), ("c2", "hang", "aaaa11112222"), ("c3", "hang", "bbbb33334444")],
        [("c1", "hang", "aaaa11112222"), ("c2", "passed", None), ("c3", "passed", None)],
    ]
    with HistoryStore(tmp_path / "h.sqlite") as s:
        for n, cells in enumerate(nights):
            run = s.start_run(matrix="m.yaml", profile="nightly")
            for cell, outcome, fp in cells:
                s.record(run, result(cell, n, outcome, fp))
            s.finish_run(run, "done")
        yield s


def test_one_finding_per_fingerprint_across_cells_and_nights(store):
    runs = [r.id for r in store.runs()]
    [a, b] = findings(store)
    assert (a.fingerprint, a.hits, a.cells, a.runs) == ("aaaa11112222", 3, ["c1", "c2"], [runs[0], runs[1], runs[2]])
    assert (a.first_run, a.last_run, a.first_seen, a.last_seen) == (runs[0], runs[2], T0, T0 + 2 * 86400)
    assert a.flags["a"] == [1, 2] and a.nights == 3 and a.gpu == {"idle": 3}
    # pooled over every night's exposure of the cells it hit: c1 1800+3600+1800, c2 3600+1800+3600
    assert a.exposure_s == pytest.approx(16200.0)
    assert a.estimate.point_s == pytest.approx(5400.0) and a.estimate.low_s < 5400 < a.estimate.high_s
    assert (b.fingerprint, b.hits, b.cells, b.nights) == ("bbbb33334444", 1, ["c3"], 1)
    assert math.isfinite(b.estimate.high_s)


def test_the_finding_shows_the_culprit_per_role_first_and_its_known_issue(store):
    [a, _] = findings(store, load_known_issues(EXAMPLE))
    assert a.culprit_frames[0].startswith("_park_forever")
    sections = role_sections(a.example)
    assert [role for role, _ in sections] == ["EngineCore", "Worker"] and sections[0][1][0]["kind"] == "culprit"
    assert a.known_issue is not None and a.known_issue.id == "vllm-37729"   # silent stall + prefix caching + fp8
    assert a.to_dict()["known_issue"]["url"].endswith("/37729")


def test_a_store_from_before_fingerprints_were_columns_is_migrated(tmp_path):
    import sqlite3
    path = tmp_path / "old.sqlite"
    with HistoryStore(path) as s:
        run = s.start_run(matrix="m", profile="p")
        s.record(run, result("c1", 0, "hang", "cccc55556666"))
    db = sqlite3.connect(path)   # as a version-3 store left it: no fingerprint column
    db.execute("DROP INDEX results_fingerprint")
    db.execute("ALTER TABLE results DROP COLUMN fingerprint")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with HistoryStore(path) as s:
        assert [f.fingerprint for f in findings(s)] == ["cccc55556666"]
