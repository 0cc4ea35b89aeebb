"""matrix/run.py's ResultSink: every finished cell goes to the store at once; a JUnit that cannot be
written (a full or read-only disk) is a warning that the run's end reports, never a crash mid-run."""

from __future__ import annotations

import errno

from soakmatrix.matrix import run as run_module
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.history import HistoryStore


def finished(cell: str, outcome: str = "passed") -> CellResult:
    return CellResult(cell_id=cell, cell_name=f"m|H200|{cell}|w", outcome=Outcome(outcome), model="m",
                      gpu_type="H200", workload="w", flags={}, exposure_s=60.0,
                      signature="silent_stall" if outcome == "hang" else None)


def sink_for(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite")
    run_id = store.start_run(matrix="m", profile="p")
    return store, run_module.ResultSink(store, run_id, tmp_path / "h.sqlite", tmp_path / "out", suite="s",
                                        properties={}, clock=lambda: 1e9)


def test_a_full_disk_mid_run_keeps_every_result_and_says_junit_was_not_written(tmp_path, monkeypatch):
    store, sink = sink_for(tmp_path)
    (tmp_path / "out").mkdir()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("soakmatrix.reports.junit.write_junit", disk_full)
    sink.cell_finished(object(), finished("a"))          # the rewrite at the cell fails: no exception
    sink.cell_finished(object(), finished("b", "hang"))
    assert [r.cell_id for r in store.results(sink.run_id)] == ["a", "b"]
    assert sink.write_junit() is False
    assert sink.warnings == [f"JUnit not written to {tmp_path / 'out' / 'junit.xml'}: No space left on device"]
    store.close()


def test_the_summary_names_no_junit_that_was_not_written(tmp_path):
    text = run_module.summary_text([finished("a")], None, None, tmp_path / "h.sqlite")
    assert "JUnit" not in text and "history:" in text
    assert f"JUnit: {tmp_path / 'j.xml'}" in run_module.summary_text([finished("a")], tmp_path / "j.xml", None,
                                                                      tmp_path / "h.sqlite")


def test_a_written_junit_is_true(tmp_path):
    store, sink = sink_for(tmp_path)
    (tmp_path / "out").mkdir()
    store.record(sink.run_id, finished("a"))
    assert sink.write_junit() is True and (tmp_path / "out" / "junit.xml").exists()
    store.close()
