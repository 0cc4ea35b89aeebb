"""Re-hashing a store's fingerprints with today's code: one hang recorded by older code under five
fingerprints (five sampling moments inside one wait) becomes one finding again, through the real
`soakmatrix report --refingerprint`; results whose evidence is gone or reads back otherwise keep theirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from soakmatrix.jobs.signatures import classify, clues_from_texts
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix import refingerprint as rf
from soakmatrix.reports.findings import findings
from soakmatrix.reports.history import HistoryStore

from tests.incident_dumps import WAIT_MOMENTS, dump, worker_stuck

LOG = "INFO Application startup complete.\nWARNING No available shared memory broadcast block found in 60 seconds.\n"


def hang_result(folder: Path, cell: str, pyspy: str, fingerprint: str) -> CellResult:
    """A hang as the soak job records it, its evidence in `folder`, with `fingerprint` as older code wrote it."""
    folder.mkdir(parents=True)
    (folder / "py-spy.txt").write_text(pyspy)
    (folder / "server.log").write_text(LOG)
    cls = classify(clues_from_texts([pyspy], LOG.splitlines(), verdict_kind="hang"))
    assert cls.signature == "shm_broadcast_timeout" and cls.stuck_frames
    return CellResult(cell_id=cell, cell_name=f"cell-{cell}", outcome="hang", signature=cls.signature,
                      fingerprint=fingerprint, stuck_frames=list(cls.stuck_frames), culprit=cls.culprit,
                      exposure_s=1800.0, time_to_hang_s=1800.0,
                      artifacts={"py_spy": str(folder / "py-spy.txt"), "server_log": str(folder / "server.log")})


def old_store(tmp_path: Path) -> tuple[Path, str]:
    """Two nights: the TP 2 shm hang at five sampling moments, each under a stale fingerprint of its
    own, plus one whose dump was deleted since and one whose dump is now another hang's."""
    text = dump("sim_tp2_shm_broadcast.pyspy.txt")
    path = tmp_path / "history.sqlite"
    with HistoryStore(path) as store:
        for night, moments in enumerate([list(WAIT_MOMENTS)[:3], list(WAIT_MOMENTS)[3:]]):
            run = store.start_run(matrix="nightly.yaml", profile="nightly")
            for i, moment in enumerate(moments):
                cell = f"n{night}c{i}"
                store.record(run, hang_result(tmp_path / cell, cell, worker_stuck(text, moment), f"old{night}{i}000000"))
            store.finish_run(run, "found")
        run = store.start_run(matrix="nightly.yaml", profile="nightly")
        gone = hang_result(tmp_path / "gone", "gone", worker_stuck(text, "in _is_owned"), "gone00000000")
        (tmp_path / "gone" / "py-spy.txt").unlink()
        store.record(run, gone)
        moved = hang_result(tmp_path / "moved", "moved", worker_stuck(text, "in _is_owned"), "moved0000000")
        (tmp_path / "moved" / "py-spy.txt").write_text(text.replace("sample_tokens_stuck (", "load_weights_stuck ("))
        store.record(run, moved)
        store.finish_run(run, "found")
    today = classify(clues_from_texts([worker_stuck(text, "in the acquire")], verdict_kind="hang")).fingerprint
    return path, today


def soakmatrix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_report_refingerprint_joins_one_hangs_old_fingerprints(tmp_path):
    path, today = old_store(tmp_path)
    with HistoryStore(path, create=False) as store:
        assert len(findings(store)) == 7          # what a user saw before: one bug, five findings (+2)
    done = soakmatrix("report", str(path), "--refingerprint")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first == ("re-hashed 7 hang and crash result(s): 5 changed (5 fingerprint(s) -> 1), 0 the same, "
                     "kept as recorded: 1 (evidence reads back different frames), 1 (no stacks on disk)"), first
    with HistoryStore(path, create=False) as store:
        by_fp = {f.fingerprint: f for f in findings(store)}
        assert set(by_fp) == {today, "gone00000000", "moved0000000"}
        assert by_fp[today].hits == 5 and by_fp[today].nights == 2
        # the column the reports query and the JSON kept whole agree
        assert {r.fingerprint for run in store.runs() for r in store.results(run.id)} == set(by_fp)
    # the findings table printed after the re-hash already shows the joined finding
    assert today in done.stdout and "old00000000" not in done.stdout
    again = soakmatrix("report", str(path), "--refingerprint")
    assert again.stdout.startswith("re-hashed 7 hang and crash result(s): 0 changed, 5 the same, kept as recorded: 1 ")


def test_recompute_leaves_what_it_cannot_read_back(tmp_path):
    text = dump("sim_tp2_shm_broadcast.pyspy.txt")
    result = hang_result(tmp_path / "a", "a", worker_stuck(text, "in _release_save"), "stale0000000")
    files = {p: Path(p).read_text() for p in result.artifacts.values()}
    new, outcome = rf.recompute(result, files.get)
    assert outcome == rf.CHANGED and new == classify(clues_from_texts([text], verdict_kind="hang")).fingerprint
    assert rf.recompute(result, lambda p: None) == (None, rf.NO_EVIDENCE)
    renamed = CellResult.from_json(result.to_json())
    renamed.signature = "a_signature_since_removed"
    assert rf.recompute(renamed, files.get) == (None, rf.UNKNOWN_SIGNATURE)
    no_frames = CellResult.from_json(result.to_json())
    no_frames.stuck_frames = []
    assert rf.recompute(no_frames, files.get) == (None, rf.NO_FRAMES)
    # a server log that rotated away does not matter when the stacks carry the culprit
    assert rf.recompute(result, lambda p: files[p] if p.endswith("py-spy.txt") else None) == (new, rf.CHANGED)


def test_a_deadlock_recorded_under_a_static_python_rejoins_its_finding(tmp_path):
    """A static interpreter's `PyThread_acquire_lock_timed (python3.11)` entered the hash before: the
    night recorded so gets the fingerprint every other Python build gives the same deadlock."""
    from tests.test_fingerprint_versions import PYSPY, recorded

    static = recorded("host_deadlock_schedule_py311_static_native.txt")
    (tmp_path / "py-spy.txt").write_text(static)
    cls = classify(clues_from_texts([static], verdict_kind="hang"))
    result = CellResult(cell_id="s", cell_name="cell-s", outcome="hang", signature=cls.signature,
                        fingerprint="72f7de56ee60", stuck_frames=list(cls.stuck_frames), culprit=cls.culprit,
                        artifacts={"py_spy": str(tmp_path / "py-spy.txt")})
    shared = classify(clues_from_texts([recorded("host_deadlock_schedule_py312_shared_native.txt")],
                                       verdict_kind="hang")).fingerprint
    assert PYSPY.is_dir() and rf.recompute(result, rf.read_text_or_none) == (shared, rf.CHANGED)
