"""End to end through the real CLI: `python -m soakmatrix.matrix.cli watch` against a simulated server with
a planted hang; the incident is in the evidence folder, the hook ran, and the history store shows it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from soakmatrix.fixtures.sim_testing import SimProcess, load

pytestmark = pytest.mark.waits   # the watch's interval and a simulated server's clock


def test_usage_errors_exit_2():
    p = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", "not-a-url"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not an http(s) URL" in p.stderr


PASSWORD = "pw-planted-0123456789"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cli_catches_a_planted_hang_keeps_evidence_runs_hook_and_stores_it(tmp_path):
    hangs = tmp_path / "hangs.yaml"
    hangs.write_text("seed: 5\nhangs:\n  - id: cli-shm\n    style: shm_broadcast\n    when: {max_num_seqs: 253}\n"
                     "    min_running: 1\n    mttf_s: 3\n")
    log = tmp_path / "sim.log"
    store, out = tmp_path / "history.db", tmp_path / "incidents"
    with SimProcess(["--max-num-seqs", "253", "--hang-model", str(hangs)], log) as sim:
        threading.Thread(target=load, args=(sim.url, 4, 60), kwargs={"request_timeout": 70}, daemon=True).start()
        # with credentials in its URL: none is sent, printed or kept
        url = sim.url.replace("http://", f"http://watcher:{PASSWORD}@") + f"?api_key={PASSWORD}"
        p = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", url, "--log", str(log),
                            "--out", str(out), "--store", str(store), "--max-incidents", "1", "--duration", "90s",
                            "--on-hang", 'echo "$SOAKMATRIX_SIGNATURE" > "$SOAKMATRIX_EVIDENCE_DIR/hook.txt"'],
                           capture_output=True, text=True, timeout=150)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "HANG detected" in p.stdout and "recorded in" in p.stdout
    (folder,) = out.iterdir()
    assert (folder / "py-spy.txt").exists() and (folder / "metrics.txt").exists()
    assert (folder / "hook.txt").read_text().strip() == "shm_broadcast_timeout"
    from soakmatrix.reports.history import HistoryStore
    with HistoryStore(store, create=False) as h:
        (run,) = h.runs()
        (result,) = h.results(run.id)
    assert run.kind == "watch" and result.outcome.value == "hang" and result.signature == "shm_broadcast_timeout"
    report = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "report", str(store)],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "shm_broadcast_timeout" in report.stdout
    kept = [f.read_bytes() for f in [*out.rglob("*"), store] if f.is_file()]
    assert not [k for k in kept + [(p.stdout + p.stderr + report.stdout).encode()] if PASSWORD.encode() in k]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("when", ["while it runs", "before it starts"])
def test_a_watch_whose_reader_goes_away_keeps_watching_and_writes_its_notes_beside_the_evidence(tmp_path, when):
    """`soakmatrix watch URL | head -1`, or a sidecar whose log shipper died: the watch still
    catches the hang (it used to end at its next note, exit 141), its notes in --out/watch.log;
    so too when stdout was closed before it started (`>&-`)."""
    hangs = tmp_path / "hangs.yaml"
    hangs.write_text("seed: 5\nhangs:\n  - id: cli-shm\n    style: shm_broadcast\n    when: {max_num_seqs: 253}\n"
                     "    min_running: 1\n    mttf_s: 3\n")
    log = tmp_path / "sim.log"
    out = tmp_path / "incidents"
    with SimProcess(["--max-num-seqs", "253", "--hang-model", str(hangs)], log) as sim:
        threading.Thread(target=load, args=(sim.url, 4, 60), kwargs={"request_timeout": 70}, daemon=True).start()
        early = when == "before it starts"
        watch = subprocess.Popen([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", sim.url, "--log", str(log),
                                  "--out", str(out), "--max-incidents", "1", "--duration", "90s"],
                                 stdout=None if early else subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 preexec_fn=(lambda: os.close(1)) if early else None)
        try:
            if not early:
                assert b"watch: watching" in watch.stdout.readline()
                watch.stdout.close()
            assert watch.wait(150) == 1          # the hang, caught with nobody reading
        finally:
            watch.kill()
    notes = (out / "watch.log").read_text()
    assert "the reader of this progress went away" in notes and "HANG detected" in notes
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    assert (folder / "py-spy.txt").exists()


def test_a_store_that_cannot_be_written_costs_the_record_not_the_watch(tmp_path):
    from types import SimpleNamespace

    from soakmatrix.api.watching import _store
    from soakmatrix.matrix.contracts.result import CellResult

    result = CellResult(cell_id="c", cell_name="m|g|watch|h:1", outcome="hang", model="m", gpu_type="g",
                        workload="watch", url="http://u:secretpw1@h:1")
    notes: list[str] = []
    (tmp_path / "a-folder.sqlite").mkdir()     # what a full disk or a broken store raises, the same way
    _store(tmp_path / "a-folder.sqlite", SimpleNamespace(result=result, folder=tmp_path / "evidence"), notes.append)
    assert len(notes) == 1 and "could not record the incident" in notes[0] and "evidence" in notes[0]
    _store(tmp_path / "store.sqlite", SimpleNamespace(result=result, folder=tmp_path / "evidence"), notes.append)
    assert "recorded in" in notes[-1]
    assert b"secretpw1" not in (tmp_path / "store.sqlite").read_bytes()
