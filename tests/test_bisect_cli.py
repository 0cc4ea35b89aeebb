"""`soakmatrix bisect` through the real CLI: virtual time on the demo matrix, and (slow) the same
cell on the simulated engine through Ray and soak jobs."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import EXAMPLES, REPO

pytestmark = pytest.mark.slow   # every test runs `soakmatrix bisect` as a subprocess

DEMO = EXAMPLES / "demo.yaml"
FAILING = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"


def soakmatrix(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_virtual_bisect_of_the_demo_cell_finds_mtp_and_cudagraph(tmp_path):
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--seed", "3",
                     "--emit-test", str(tmp_path / "test_regression.py"))
    assert out.returncode == 1, out.stderr          # a hang was found and isolated
    doc = json.loads(out.stdout)
    assert doc["status"] == "found"
    assert sorted(doc["minimal"]) == ["cudagraph_mode", "mtp"]
    assert doc["signature"] == "shm_broadcast_timeout"
    kinds = {v["flag"]: v["kind"] for v in doc["verdicts"]}
    assert kinds["mtp"] == kinds["cudagraph_mode"] == "necessary"
    assert kinds["async_scheduling"] != "necessary" and kinds["tp"] != "necessary"
    assert doc["gpu_hours"] > 0 and doc["probes"] >= 4
    assert doc["failing"]["hangs"] >= 2 and doc["failing"]["low_s"] < doc["failing"]["high_s"]
    # configs that never hung are bounds, never "never"
    assert all("never" not in c["mttf"] for c in doc["configs"])
    assert any(c["mttf"].startswith(">") for c in doc["configs"])
    test_file = (tmp_path / "test_regression.py").read_text()
    tree = ast.parse(test_file)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    mark = fn.decorator_list[0]
    kw = {k.arg: ast.literal_eval(k.value) for k in mark.keywords}
    assert kw["flags"]["mtp"] == 1 and kw["flags"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert kw["flags"]["async_scheduling"] is False          # back at the baseline
    assert kw["engine"] == "sim" and kw["expect"] == "pass" and kw["duration"] > 600
    assert kw["gpu_type"] == "H200" and kw["hang_model"].endswith("demo.yaml")


def test_a_cluster_nobody_answers_at_is_a_clear_exit_2_before_any_probe(tmp_path):
    from tests.conftest import free_port

    for address in (f"127.0.0.1:{free_port()}", f"ray://127.0.0.1:{free_port()}"):
        out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--backend", "sim", "--ray-address", address,
                         "--out", str(tmp_path / "out"))
        assert out.returncode == 2, out.stderr
        assert f"soakmatrix bisect: cannot reach Ray at {address}: ConnectionError: nothing answers" in out.stderr
        assert "--virtual needs no Ray" in out.stderr and "Traceback" not in out.stderr


def test_text_table_by_cell_id():
    plan = json.loads(soakmatrix("plan", str(DEMO), "--json", "--no-validate").stdout)
    cell_id = next(c["id"] for c in plan["cells"] if c["name"] == FAILING)
    out = soakmatrix("bisect", str(DEMO), "--cell", cell_id, "--virtual", "--quiet", "--no-shrink")
    assert out.returncode == 1, out.stderr
    assert "minimal set: cudagraph_mode=FULL_AND_PIECEWISE, mtp=1" in out.stdout
    assert "necessary" in out.stdout and "GPU-hours" in out.stdout


def test_usage_errors_name_the_problem():
    out = soakmatrix("bisect", str(DEMO), "--cell", "nope", "--virtual")
    assert out.returncode == 2 and "no cell 'nope'" in out.stderr
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--confidence", "1.5")
    assert out.returncode == 2 and "--confidence" in out.stderr
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--mttf-cap", "soon")
    assert out.returncode == 2 and "--mttf-cap" in out.stderr
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--modifier-prior", "1")
    assert out.returncode == 2 and "--modifier-prior" in out.stderr and "below 1" in out.stderr


def test_a_cell_that_does_not_hang_is_not_reproduced():
    cell = "tiny-moe|H200|async_scheduling=false,cudagraph_mode=FULL_DECODE_ONLY,mtp=0,tp=1|staggered"
    out = soakmatrix("bisect", str(DEMO), "--cell", cell, "--virtual", "--quiet", "--mttf-cap", "10m")
    assert out.returncode == 0
    assert "not_reproduced" in out.stdout and "MTTF >" in out.stdout


# The smallest soaked bisection on the simulated engine through Ray: one flag away from the
# baseline plants a silent stall (MTTF 10 min, 2.5 s of wall time at 240x), asked the cap's question
# without the modifier measurement; 8-9 probes in virtual time.
SOAKED_MATRIX = """\
name: bisect-resume
models: {m: {path: org/m}}
gpus: {H200: {count: 1, memory_gb: 141, ray_label: H200}}
axes: {prefix_caching: [false], enforce_eager: [false]}
workloads: {steady: {kind: random, concurrency: 4}}
profiles: {p: {soak: 20m, startup: 5s, workloads: [steady]}}
baseline: {prefix_caching: true, enforce_eager: false}
sim: {hang_model: hangs.yaml, time_scale: 240}
"""
SOAKED_HANGS = "seed: 7\nhangs:\n  - {id: planted, style: silent_stall, mttf_s: 600, when: {prefix_caching: false}}\n"
SOAKED_CELL = "m|H200|enforce_eager=false,prefix_caching=false|steady"


def soaked_bisection(folder: Path) -> tuple[str, ...]:
    (folder / "hangs.yaml").write_text(SOAKED_HANGS)
    (folder / "matrix.yaml").write_text(SOAKED_MATRIX)
    return ("bisect", str(folder / "matrix.yaml"), "--cell", SOAKED_CELL, "--json", "--backend", "sim",
            "--no-shrink", "--confidence", "0.95", "--parallel", "2", "--signature", "silent_stall",
            "--mttf-cap", "20m", "--no-modifiers")


@pytest.mark.ray_client
@pytest.mark.slow
def test_sim_engine_on_ray_stopped_then_resumed_through_a_ray_client_address_finds_the_planted_flag(tmp_path):
    """The bisection starts on the default local cluster and is stopped (SIGTERM, as CI runners and
    Kubernetes stop a job) once a round is answered; `--resume --ray-address ray://host:port`
    (Ray Client, a laptop outside the cluster) finishes it on another cluster's H200 node: the
    answered rounds are replayed, never soaked again, and the answer is the planted flag."""
    from tests.conftest import ray_client_cluster

    before = {p.pid for p in psutil.process_iter()}
    out_dir = tmp_path / "out"
    args = [sys.executable, "-m", "soakmatrix.matrix.cli", *soaked_bisection(tmp_path), "--out", str(out_dir)]
    journal = out_dir / "journal-flags.jsonl"
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and first.poll() is None:
            if journal.exists() and len(journal.read_text().splitlines()) >= 2:
                break
            time.sleep(0.5)
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, stderr[-3000:]
    assert "`--resume` continues" in stderr
    answered = sum(len(json.loads(line)["probes"]) for line in journal.read_text().splitlines()[1:])
    kept = {p: p.stat().st_mtime_ns for p in out_dir.glob("probe-*/cells/*/result.json")}
    assert answered >= 2 and len(kept) >= answered   # a round of two probes

    with ray_client_cluster(dict(num_cpus=2, num_gpus=2)) as address:
        out = soakmatrix(*args[3:], "--resume", "--ray-address", address, timeout=1500)
    assert out.returncode == 1, out.stderr[-3000:] + "\n" + address.server_logs()
    assert f"{answered} answered probe(s) replayed" in out.stderr
    doc = json.loads(out.stdout)
    assert doc["minimal"] == ["prefix_caching"]
    assert doc["oracle"] == "soak (sim)"
    # the answered rounds were not soaked again: their artifacts are as the first run left them
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in kept.items())
    results = list(out_dir.glob("probe-*/cells/*/result.json"))
    assert len(results) >= doc["probes"] > len(kept), (len(results), doc["probes"], len(kept))
    assert {json.loads(r.read_text())["gpu_type"] for r in results} == {"H200"}
    # nothing of either run is left: no process still mentions its output folder
    time.sleep(2)
    leftovers = [p for p in psutil.process_iter(["pid", "cmdline"])
                 if p.info["pid"] not in before and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers


@pytest.mark.slow
def test_emitted_regression_test_runs_under_the_soak_plugin_and_catches_the_hang(tmp_path):
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--quiet", "--seed", "3", "--no-shrink",
                     "--emit-test", str(tmp_path / "test_regression.py"))
    assert out.returncode == 1, out.stderr
    # the bug is still planted in the simulated engine, so the regression test must fail with its signature
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_regression.py")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-2000:]
    assert "shm_broadcast_timeout" in run.stdout


def test_store_records_the_bisection_for_the_dashboard(tmp_path):
    store = tmp_path / "history.sqlite"
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--quiet", "--no-shrink", "--seed", "3",
                     "--store", str(store))
    assert out.returncode == 1, out.stderr
    from soakmatrix.reports.history import HistoryStore

    with HistoryStore(store) as history:
        (report,) = history.bisections()
    assert report["cell"]["name"] == FAILING
    assert sorted(report["minimal"]) == ["cudagraph_mode", "mtp"]
    dashboard = soakmatrix("report", str(store), "--out", str(tmp_path / "site"))
    assert dashboard.returncode == 0, dashboard.stderr
    page = (tmp_path / "site" / "index.html").read_text()
    assert "cudagraph_mode" in page and "necessary" in page


def _cell_id() -> str:
    plan = json.loads(soakmatrix("plan", str(DEMO), "--json", "--no-validate").stdout)
    return next(c["id"] for c in plan["cells"] if c["name"] == FAILING)


def test_signature_option_names_the_target_and_the_rest_are_listed_with_counts():
    # the demo cell holds two planted hangs; asked for the async one, bisect finds its flags
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--quiet", "--seed", "3",
                     "--no-shrink", "--signature", "event_sync_stall")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["signature"] == "event_sync_stall" and doc["signature_source"] == "--signature"
    assert sorted(doc["minimal"]) == ["async_scheduling", "tp"]
    assert doc["other_signatures"].get("shm_broadcast_timeout", 0) > 0


def test_the_cells_recorded_signature_in_the_store_is_the_default_target(tmp_path):
    from soakmatrix.matrix.contracts.result import CellResult
    from soakmatrix.reports.history import HistoryStore

    store = tmp_path / "history.sqlite"
    with HistoryStore(store) as history:
        run = history.start_run(matrix="demo", profile="demo")
        history.record(run, CellResult(cell_id=_cell_id(), cell_name=FAILING, outcome="crash", signature="crash"))
        history.record(run, CellResult(cell_id="other", cell_name="x", outcome="hang", signature="silent_stall"))
        run2 = history.start_run(matrix="demo", profile="demo")
        history.record(run2, CellResult(cell_id=_cell_id(), cell_name=FAILING, outcome="hang",
                                        signature="event_sync_stall"))
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--quiet", "--seed", "3",
                     "--no-shrink", "--store", str(store))
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["signature"] == "event_sync_stall" and doc["signature_source"].startswith("the history store")


def test_help_lists_the_exit_codes():
    out = soakmatrix("bisect", "--help")
    assert out.returncode == 0
    for line in ("0  not reproduced", "1  found", "2  usage", "3  inconclusive"):
        assert line in out.stdout
    assert "never an\n     infrastructure error" in out.stdout or "never an infrastructure error" in out.stdout


@pytest.mark.parametrize("option", [("--max-probes", "0"), ("--budget-gpu-hours", "-1"), ("--confidence", "1.5"),
                                    ("--parallel", "0"), ("--calibration-hangs", "0"), ("--budget-gpu-hours", "nan"),
                                    ("--mttf-cap", "0s")])
def test_values_that_mean_nothing_are_usage_errors_naming_the_option(option):
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", *option)
    assert out.returncode == 2 and option[0] in out.stderr and not out.stdout


def test_a_store_that_is_not_one_is_refused_before_any_probe(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a database, just some notes\n" * 100)
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--store", str(bad))
    assert out.returncode == 2 and "--store" in out.stderr and str(bad) in out.stderr
    assert not out.stdout and "probe" not in out.stderr and "Traceback" not in out.stderr
    assert bad.read_text().startswith("not a database")


def test_an_emit_test_path_that_cannot_be_written_is_refused_before_the_bisection(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--quiet", "--seed", "3",
                     "--no-shrink", "--emit-test", str(blocker / "test_x.py"))
    assert out.returncode == 2 and out.stdout == ""
    assert "argument --emit-test" in out.stderr and "lies under a file" in out.stderr


def test_a_failure_after_the_bisection_keeps_its_result_and_exit_code(tmp_path, monkeypatch, capsys):
    import errno

    from soakmatrix.matrix import cli
    from soakmatrix.matrix.bisect import emit

    def disk_full(*_args, **_kwargs):   # what no check up front can foresee: the disk fills during the run
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(emit, "write_regression_test", disk_full)
    umask = os.umask(0o077)   # the CLI sets its own; the test process keeps the one it had
    try:
        code = cli.main(["bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--quiet", "--seed", "3",
                         "--no-shrink", "--emit-test", str(tmp_path / "test_x.py")])
    finally:
        os.umask(umask)
    out = capsys.readouterr()
    assert code == 1
    assert json.loads(out.out)["status"] == "found"
    assert "--emit-test" in out.err and "No space left" in out.err and "the result above stands" in out.err


def test_a_flag_missing_from_the_baseline_is_a_located_error_or_context(tmp_path):
    text = DEMO.read_text().replace("  tp: 1\nsim:", "sim:")        # tp leaves the baseline
    assert "tp: 1\nsim" not in text
    matrix = tmp_path / "demo.yaml"
    matrix.write_text(text)
    (tmp_path / "hangs").mkdir()
    (tmp_path / "hangs" / "demo.yaml").write_text((EXAMPLES / "hangs" / "demo.yaml").read_text())
    out = soakmatrix("bisect", str(matrix), "--cell", FAILING, "--virtual", "--quiet")
    assert out.returncode == 2, out.stderr
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("baseline:"))
    assert f"{matrix}:{line}: baseline.tp: " in out.stderr and "add `tp:" in out.stderr


def test_no_modifiers_reports_flags_outside_the_set_as_unmeasured_and_spends_less():
    common = ("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--json", "--quiet", "--seed", "4", "--no-shrink",
              "--signature", "shm_broadcast_timeout")
    full = json.loads(soakmatrix(*common).stdout)
    lean = json.loads(soakmatrix(*common, "--no-modifiers").stdout)
    assert sorted(lean["minimal"]) == sorted(full["minimal"]) == ["cudagraph_mode", "mtp"]
    kinds = {v["flag"]: v["kind"] for v in lean["verdicts"]}
    assert kinds["async_scheduling"] == kinds["tp"] == "unmeasured"
    assert kinds["mtp"] == kinds["cudagraph_mode"] == "necessary"
    # fewer probes; not always fewer GPU-hours: by default the modifier soaks' hangs (the failing
    # cell's, each innocent removal's) are the reference rate the necessity soaks read, and more of
    # them shorten those soaks (here 29.5 GPU-hours with the verdicts, 31.5 without)
    assert lean["probes"] < full["probes"]


def test_a_bisection_stopped_by_its_budget_resumes_from_its_journal(tmp_path):
    common = ("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--seed", "3", "--no-shrink", "--signature",
              "shm_broadcast_timeout", "--out", str(tmp_path))
    short = soakmatrix(*common, "--budget-gpu-hours", "1", "--json")
    assert short.returncode == 3, short.stderr            # inconclusive: the budget ran out
    spent = json.loads(short.stdout)["probes"]
    journal = tmp_path / "journal-flags.jsonl"
    # every soak answered is on file (a probe another signature cut short is soaked again: more soaks than probes)
    soaked = len(journal.read_text().splitlines()) - 1
    assert soaked >= spent > 0
    # a fresh start would throw those probes away: refused, the file untouched
    before = journal.read_text()
    again = soakmatrix(*common)
    assert again.returncode == 2 and "--resume continues it" in again.stderr and journal.read_text() == before
    other = soakmatrix(*common[:-4], "--confidence", "0.9", "--signature", "shm_broadcast_timeout", "--out",
                       str(tmp_path), "--resume")
    assert other.returncode == 2, other.stderr
    assert "journal-flags.jsonl:1: confidence: the journal's bisection had 0.95, this one has 0.9" in other.stderr
    resumed = soakmatrix(*common, "--resume", "--json")
    assert resumed.returncode == 1, resumed.stderr
    assert f"{soaked} answered probe(s) replayed" in resumed.stderr
    doc = json.loads(resumed.stdout)
    assert sorted(doc["minimal"]) == ["cudagraph_mode", "mtp"] and doc["probes"] > spent
    assert len(journal.read_text().splitlines()) > 1 + soaked
    # virtual time keeps no journal unless asked where: nothing to resume from
    nowhere = soakmatrix("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--resume")
    assert nowhere.returncode == 2 and "--resume: with --virtual, give the --out" in nowhere.stderr


def test_max_soak_cuts_long_probes_into_journaled_pieces(tmp_path):
    common = ("bisect", str(DEMO), "--cell", FAILING, "--virtual", "--seed", "3", "--no-shrink", "--signature",
              "shm_broadcast_timeout", "--out", str(tmp_path), "--json", "--quiet")
    out = soakmatrix(*common, "--max-soak", "30m")
    assert out.returncode == 1, out.stderr
    assert sorted(json.loads(out.stdout)["minimal"]) == ["cudagraph_mode", "mtp"]
    lines = [json.loads(line) for line in (tmp_path / "journal-flags.jsonl").read_text().splitlines()]
    soaks = [p["soak_s"] for batch in lines[1:] for p in batch["probes"]]
    assert max(soaks) <= 1800.0 and soaks.count(1800.0) > 3           # the long soaks went in pieces
    other = soakmatrix(*common, "--max-soak", "1h", "--resume")
    assert other.returncode == 2 and "max_soak_s: the journal's bisection had 1800.0, this one has 3600.0" in other.stderr


def test_a_bisection_whose_progress_reader_goes_away_finishes_and_keeps_its_progress(tmp_path):
    """`soakmatrix bisect ... 2>&1 | head`-like: the bisection goes on to its verdict (it used to
    end at the next progress line, exit 141), the rest of its progress in --out."""
    driver = subprocess.Popen([sys.executable, "-m", "soakmatrix.matrix.cli", "bisect", str(DEMO), "--cell", FAILING,
                               "--virtual", "--json", "--seed", "3", "--out", str(tmp_path / "out")],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert driver.stderr.readline()       # the first progress line reached the reader ...
        driver.stderr.close()                 # ... which then goes away
        driver.stderr = None
        stdout, _ = driver.communicate(timeout=300)
    finally:
        driver.kill()
    assert driver.returncode == 1             # a hang was found and isolated, as with a reader
    doc = json.loads(stdout)
    assert doc["status"] == "found" and sorted(doc["minimal"]) == ["cudagraph_mode", "mtp"]
    log = (tmp_path / "out" / "progress.log").read_text().splitlines()
    assert "the reader of this progress went away" in log[0]
    assert sum(line.startswith("probe ") for line in log) >= 4
