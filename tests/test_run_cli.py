"""`soakmatrix run` end to end through the real CLI: the demo, resume after a killed driver,
cells no node can host. Ray clusters live on this machine; every Ray and server process is checked gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from tests.conftest import EXAMPLES, REPO

from soakmatrix.matrix.contracts.outcomes import Outcome

CLI = [sys.executable, "-m", "soakmatrix.matrix.cli"]

HEALTHY = """
name: {name}
models: {{m: {{path: org/m, mtp_head: true}}}}
gpus:
  H200: {{count: 2, memory_gb: 141, ray_label: H200}}
{extra_gpus}
axes: {{mtp: [0, 1], cudagraph_mode: [FULL_DECODE_ONLY, PIECEWISE], async_scheduling: [true, false]}}
workloads: {{steady: {{kind: random, concurrency: 4}}}}
profiles: {{p: {{soak: {soak}, startup: 5s, workloads: [steady], retries: 1}}}}
sim: {{time_scale: 240}}
"""


def write_matrix(folder: Path, name: str, soak: str = "20m", extra_gpus: str = "") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(HEALTHY.format(name=name, soak=soak, extra_gpus=extra_gpus))
    return path


def run_cli(*args: str, timeout: float = 400, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})


def leftovers(marker: str) -> list[psutil.Process]:
    """Processes whose command line mentions `marker` (an output folder or a Ray session's pid)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_gone(marker: str, timeout: float = 30) -> None:
    psutil.wait_procs(leftovers(marker), timeout=timeout)
    left = []
    for p in leftovers(marker):
        try:
            left.append(f"pid {p.pid} ppid {p.ppid()} started {time.time() - p.create_time():.0f} s ago: "
                        f"{' '.join(p.cmdline())}")
        except psutil.Error:
            continue
    assert left == [], f"processes left behind mentioning {marker}: {left}"


def store_of(out: Path):
    from soakmatrix.reports.history import HistoryStore
    return HistoryStore(out / "history.sqlite")


DASHBOARD_PORT = {}


@pytest.fixture(scope="module")
def cluster():
    """A two-node cluster (head without GPUs, one node with 2 simulated H200s) the CLI joins by
    address; its head runs the job server so `ray job submit` works too."""
    ray = pytest.importorskip("ray")

    from tests.conftest import free_port, start_ray_cluster
    from ray._private.utils import write_ray_address

    # A temp dir of its own, holding this cluster's address as `ray start --temp-dir` leaves it: a Ray
    # job's driver is given the address its head finds in its temp dir (`ray_current_cluster`). In
    # the shared /tmp/ray that is whichever cluster on this machine started last (seen under two
    # workers: the job joined the real-engine tests' cluster); in a temp dir without it, any running
    # cluster. Short: Ray's Unix sockets live under it.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")

    def head_node_args():   # fresh ports for each attempt
        DASHBOARD_PORT["port"] = free_port()
        return {"num_cpus": 1, "num_gpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1",
                "dashboard_port": DASHBOARD_PORT["port"], "temp_dir": temp_dir,
                # the job agent's default port may belong to another Ray cluster on this machine
                "dashboard_agent_listen_port": free_port()}

    c, _ = start_ray_cluster(head_node_args, {"h200": dict(num_cpus=1, num_gpus=2,
                                                           resources={"accelerator_type:H200": 1})})
    write_ray_address(c.address, temp_dir)
    ray.shutdown()   # the CLI is the driver; the cluster stays up
    try:
        yield c.address
    finally:
        c.shutdown()
        from tests.test_cluster import ray_processes_of
        psutil.wait_procs(ray_processes_of(os.getpid()), timeout=30)
        assert ray_processes_of(os.getpid()) == []
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.ray_client
@pytest.mark.slow
def test_a_ray_client_address_runs_the_matrix_on_the_cluster(tmp_path):
    """`--ray-address ray://host:port` (Ray Client, the address a laptop outside the cluster uses):
    the cells are placed on the cluster's GPU node and every result comes back to the driver."""
    from tests.conftest import ray_client_cluster

    out = tmp_path / "out"
    with ray_client_cluster(dict(num_cpus=1, num_gpus=2)) as address:
        result = run_cli("run", str(write_matrix(tmp_path, "client")), "--out", str(out),
                         "--ray-address", address, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:] + "\n" + address.server_logs()
    assert f"on Ray cluster at {address}" in result.stderr
    with store_of(out) as store:
        results = store.results(store.latest_run_id())
    assert len(results) == 8 and all(r.outcome is Outcome.PASSED and r.exposure_s > 0 for r in results)
    assert len(ET.parse(out / "junit.xml").getroot().findall(".//testcase")) == 8
    assert_gone(str(out))              # every simulated server


@pytest.mark.slow
def test_demo_end_to_end_finds_the_planted_hangs(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.Popen([*CLI, "run", str(EXAMPLES / "demo.yaml"), "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=500)
    finally:
        proc.kill()
    assert proc.returncode == 1, output           # a hang was found
    assert "20/20 done" in output and "hang" in output
    junit = ET.parse(out / "junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert len(cases) == 20
    assert len({c.get("name") for c in cases}) == 20
    failed = [c for c in cases if c.find("failure") is not None]
    assert failed, "the demo's planted hangs were not reported as failures"
    with store_of(out) as store:
        results = store.results(store.latest_run_id())
    hangs = [r for r in results if r.outcome is Outcome.HANG]
    assert len(failed) == len(hangs)
    # both planted hangs found, each only where the hang model puts it
    signatures = {r.signature for r in hangs}
    assert {"shm_broadcast_timeout", "event_sync_stall"} <= signatures
    for r in hangs:
        # on a failure, what was found beside what the simulator says truly hung (if anything did)
        planted = r.artifacts.get("sim_hangs")
        truth = Path(planted).read_text() if planted and Path(planted).exists() else "no planted hang fired"
        notes = r.artifacts.get("evidence_notes")
        notes = Path(notes).read_text() if notes and Path(notes).exists() else ""
        seen = (f"{r.cell_name}: {r.signature} ({r.detector}: {r.message}); the simulator: {truth}; "
                f"stuck frames: {r.stuck_frames}; culprit: {r.culprit}; evidence notes: {notes}")
        if r.signature == "event_sync_stall":
            assert r.flags["async_scheduling"] is True and r.flags["tp"] == 2 and r.gpu_type == "H200", seen
        else:
            assert r.flags["mtp"] == 1 and r.flags["cudagraph_mode"] == "FULL_AND_PIECEWISE", seen
    assert all(r.outcome is Outcome.PASSED for r in results if r not in hangs)
    # every node passed its preflight (the simulated backend's: ptrace alone), kept in each result
    assert all(r.preflight["backend"] == "sim" and r.preflight["ok"] for r in results)
    # one planted bug, one finding: the shm broadcast hang's stuck step is the same at TP 1 (a thread
    # of the engine core) and TP 2 (a worker process)
    shm = [r for r in hangs if r.signature == "shm_broadcast_timeout"]
    # on a failure, every cell the shm hang is planted in: what it ended as, who fired, stalls that
    # recovered, whose stacks were missing and how long taking them took
    planted = [r for r in results if r.flags["mtp"] == 1 and r.flags["cudagraph_mode"] == "FULL_AND_PIECEWISE"]
    how = [(r.flags["tp"], r.gpu_type, r.outcome.value, r.signature, r.detector, r.message, r.fingerprint,
            r.culprit or "no culprit", r.evidence_s, r.stalls,
            Path(r.artifacts["evidence_notes"]).read_text() if "evidence_notes" in r.artifacts else "")
           for r in planted]
    assert {r.flags["tp"] for r in shm} == {1, 2} and len({r.fingerprint for r in shm}) == 1, how
    assert (out / "dashboard" / "index.html").is_file()
    assert_gone(f"_{proc.pid}/")       # the local Ray cluster (its session is named after the driver)
    assert_gone(str(out))              # every simulated server


@pytest.mark.slow
def test_resume_after_killing_the_driver_reruns_only_unfinished_cells(tmp_path, cluster):
    matrix = write_matrix(tmp_path, "resume")
    out = tmp_path / "out"
    args = ["run", str(matrix), "--out", str(out), "--ray-address", cluster]
    driver = subprocess.Popen([*CLI, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        finished: dict = {}
        while time.time() < deadline and driver.poll() is None:
            if (out / "history.sqlite").exists():
                with store_of(out) as store:
                    run_id = store.latest_run_id()
                    finished = {r.cell_id: r for r in store.results(run_id)} if run_id else {}
                if len(finished) >= 3 and min(r.ended_at for r in finished.values()) < time.time() - 5:
                    break   # and one result is old enough that JUnit must hold it
            time.sleep(0.5)
        assert driver.poll() is None, "the run ended before the driver could be killed"
        killed_at = time.time()
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        driver.kill()
    with store_of(out) as store:
        [run] = store.runs()
        before = {r.cell_id: r for r in store.results(run.id)}
        planned = store.planned_cell_ids(run.id)
    assert run.status is None and 3 <= len(before) < len(planned) == 8
    # JUnit is never behind the store by more than the cells of the last few seconds
    in_junit = {c.get("name") for c in ET.parse(out / "junit.xml").getroot().iter("testcase")}
    settled = [r.cell_name for r in before.values() if r.ended_at < killed_at - 4]
    assert settled and set(settled) <= in_junit, (settled, in_junit)

    resumed = run_cli(*args, "--resume")
    # on a failure, what the healthy cells that did not pass saw (a false alarm on a busy machine)
    seen = [(r.cell_name, r.outcome.value, r.detector, r.message, r.stalls)
            for r in before.values() if r.outcome is not Outcome.PASSED]
    assert resumed.returncode == 0, (resumed.stderr, seen)
    assert f"{len(before)} already have a verdict" in resumed.stderr
    with store_of(out) as store:
        [run] = store.runs()                 # the same run, now finished
        after = {r.cell_id: r for r in store.results(run.id)}
    assert run.status == "finished"
    assert set(after) == set(planned)        # none lost
    for cell_id, result in before.items():   # none rerun
        assert after[cell_id].started_at == result.started_at
        assert f"start    {result.cell_name}" not in resumed.stderr
    assert all(r.outcome is Outcome.PASSED for r in after.values())
    assert_gone(str(out))


@pytest.mark.slow
def test_cells_no_node_can_host_are_reported_up_front_and_exit_3(tmp_path, cluster):
    matrix = write_matrix(tmp_path, "unplaceable", soak="5m",
                          extra_gpus="  H20: {count: 8, memory_gb: 96, ray_label: H20}")
    out = tmp_path / "out"
    result = run_cli("run", str(matrix), "--out", str(out), "--ray-address", cluster, timeout=300)
    assert result.returncode == 3, result.stderr
    assert "cannot place m|H20|" in result.stderr and "accelerator_type:H20" in result.stderr
    with store_of(out) as store:
        results = store.results(store.latest_run_id())
    by_gpu = {}
    for r in results:
        by_gpu.setdefault(r.gpu_type, set()).add(r.outcome)
    assert by_gpu == {"H20": {Outcome.INFRA_ERROR}, "H200": {Outcome.PASSED}}
    errors = ET.parse(out / "junit.xml").getroot().findall(".//testcase/error")
    assert len(errors) == 8
    assert_gone(str(out))


@pytest.mark.slow
def test_a_run_whose_progress_reader_goes_away_soaks_every_cell_and_exits_with_its_verdict(tmp_path, cluster):
    """`soakmatrix run ... 2>&1 | head`, or a CI log pipe that closes: the nightly is not ended
    (it used to stop at once, exit 141, every cell unrun); the progress goes on in the output folder."""
    matrix = write_matrix(tmp_path, "reader-gone", soak="5m")
    out = tmp_path / "out"
    driver = subprocess.Popen([*CLI, "run", str(matrix), "--out", str(out), "--ray-address", cluster], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert driver.stderr.readline().startswith(b"soakmatrix run: reader-gone/p: 8 cells")
        driver.stderr.close()                # the reader goes away before any cell has run
        assert driver.wait(300) == 0
    finally:
        driver.kill()
    with store_of(out) as store:
        [run] = store.runs()
        results = store.results(run.id)
    assert run.status == "finished" and len(results) == 8
    assert {r.outcome for r in results} == {Outcome.PASSED}
    log = (out / "progress.log").read_text()
    assert "the reader of this progress went away" in log and "results: 8 passed" in log
    assert len(ET.parse(out / "junit.xml").getroot().findall(".//testcase")) == 8
    assert_gone(str(out))


def test_a_bad_matrix_is_a_usage_error_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: {m: {path: m}}\ngpus: {H200: {count: 0, memory_gb: 1}}\n")
    result = run_cli("run", str(bad), "--out", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "count" in result.stderr


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # what `cmd &` in a non-interactive shell hands down


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigint", "sigterm", "sigint-inherited-as-ignored"])
def test_sigint_and_sigterm_cancel_cleanly_and_tear_every_server_down(tmp_path, cluster, how):
    matrix = write_matrix(tmp_path, "interrupt", soak="4h")      # 60 s of wall time per cell
    out = tmp_path / "out"
    driver = subprocess.Popen([*CLI, "run", str(matrix), "--out", str(out), "--ray-address", cluster], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=_ignore_sigint if how == "sigint-inherited-as-ignored" else None)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(list(out.glob("cells/*/command.txt"))) < 2:
            time.sleep(0.5)
        assert len(list(out.glob("cells/*/command.txt"))) == 2, "two servers should be running"
        time.sleep(2)
        driver.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        output, _ = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode == (143 if how == "sigterm" else 130), output
    assert "cancelled before a verdict" in output and "--resume" in output
    assert "Traceback" not in output and "results: none" in output       # a summary, not a stack dump
    assert (out / "junit.xml").is_file() and (out / "dashboard" / "index.html").is_file()   # flushed
    assert_gone(str(out))
    with store_of(out) as store:
        [run] = store.runs()
        assert run.status is None and store.results(run.id) == []   # nothing half-done recorded


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # what `nohup` hands down


def _default_sighup() -> None:
    # a terminal's session: this suite may itself run under nohup, or a CI runner that ignores SIGHUP
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start_two_servers(tmp_path: Path, cluster: str, name: str, preexec=None) -> tuple[subprocess.Popen, Path]:
    matrix = write_matrix(tmp_path, name, soak="4h")      # 60 s of wall time per cell
    out = tmp_path / "out"
    driver = subprocess.Popen([*CLI, "run", str(matrix), "--out", str(out), "--ray-address", cluster], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=preexec)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out.glob("cells/*/command.txt"))) < 2:
        time.sleep(0.5)
    assert len(list(out.glob("cells/*/command.txt"))) == 2, "two servers should be running"
    time.sleep(2)
    return driver, out


@pytest.mark.slow
def test_a_terminal_that_hangs_up_stops_the_run_cleanly_and_its_summary_goes_to_the_output_folder(tmp_path, cluster):
    """The SSH session that ran the nightly closes: SIGHUP, and nobody reads the output any more.
    SIGHUP's default ended the driver on the spot (no teardown, no summary); now it stops like
    SIGTERM, exit 129, and what it would have printed is in OUT/progress.log."""
    driver, out = _start_two_servers(tmp_path, cluster, "hangup", preexec=_default_sighup)
    try:
        driver.stdout.close()                     # the terminal is gone ...
        driver.send_signal(signal.SIGHUP)         # ... and says so
        assert driver.wait(120) == 129
    finally:
        driver.kill()
    log = (out / "progress.log").read_text()
    assert "stopped by SIGHUP" in log and "cancelled before a verdict" in log and "--resume" in log
    assert "Traceback" not in log and "results: none" in log
    assert (out / "junit.xml").is_file()
    assert_gone(str(out))
    with store_of(out) as store:
        [run] = store.runs()
        assert run.status is None          # unfinished: `--resume` continues it


@pytest.mark.slow
def test_under_nohup_a_sighup_leaves_the_run_going(tmp_path, cluster):
    driver, out = _start_two_servers(tmp_path, cluster, "nohup", preexec=_ignore_sighup)
    try:
        driver.send_signal(signal.SIGHUP)
        time.sleep(5)
        assert driver.poll() is None, "nohup asked for the run to outlive its terminal"
        driver.send_signal(signal.SIGTERM)
        output, _ = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode == 143 and b"stopped by SIGTERM" in output
    assert_gone(str(out))


# -- the CI examples ---------------------------------------------------------------------------------

CI = REPO / "matrix" / "ci"


def soakmatrix_commands(text: str) -> list[list[str]]:
    """Every `soakmatrix run|smoke ...` command in a CI file, continuation lines joined, CI
    expressions and shell variables replaced by placeholders."""
    import re
    import shlex

    text = re.sub(r"\$\{\{[^}]*\}\}", "X", text.replace("\\\n", " "))
    text = re.sub(r"\$\$?\{?\(?[A-Za-z_][A-Za-z_0-9]*\}?\)?", "X", text)
    out = []
    for line in text.splitlines():
        m = re.search(r"\bsoakmatrix (run|smoke) (.*)", line)
        if m and not m.group(2).startswith('"X'):
            args = shlex.split(m.group(2).split(" || ")[0].split(";")[0], comments=True)
            out.append([m.group(1), *(a for a in args if a != "X")])   # a lone X was an optional flag
    return out


def test_ci_examples_schedule_nightly_and_smoke_pull_requests_with_real_options():
    import argparse
    import importlib

    import yaml

    workflow = yaml.safe_load((CI / "github-actions.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))
    assert "schedule" in triggers and "pull_request" in triggers
    assert triggers["schedule"][0]["cron"].count(" ") == 4
    pipeline = yaml.safe_load((CI / "buildkite.yml").read_text())
    assert any("schedule" in step.get("if", "") for step in pipeline["steps"] if isinstance(step, dict))
    commands = []
    gitlab = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    assert any("schedule" in str(job.get("rules")) for job in gitlab.values() if isinstance(job, dict))
    assert any("merge_request_event" in str(job.get("rules")) for job in gitlab.values() if isinstance(job, dict))
    for name in ("github-actions.yml", "buildkite.yml", "gitlab-ci.yml"):
        found = soakmatrix_commands((CI / name).read_text())
        assert {c[0] for c in found} >= {"run", "smoke"}, name
        commands += found
    for command, *rest in commands:
        module = importlib.import_module(f"soakmatrix.matrix.cli.{command}")
        parser = argparse.ArgumentParser(exit_on_error=False)
        module.configure(parser)
        for action in parser._actions:   # the files they name are the CI's checkout's, not ours
            if getattr(action.type, "kind", "").startswith(("path", "dir", "log")):
                action.type = None
        parser.parse_args(rest)   # raises on an option the CLI does not have, or a value it refuses
    assert any("--fail-fast" in c and "--changed-files" in c for c in commands)
    assert any("--profile" in c and "nightly" in c for c in commands)
    subprocess.run(["bash", "-n", str(CI / "ray-job-submit.sh")], check=True)


def test_kuberay_manifest_has_one_worker_group_per_gpu_type_of_the_nightly_matrix():
    import yaml

    from soakmatrix.matrix.spec import load_matrix

    docs = list(yaml.safe_load_all((CI / "kuberay-raycluster.yaml").read_text()))
    [cluster] = [d for d in docs if d["kind"] == "RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    groups = cluster["spec"]["workerGroupSpecs"]
    nightly = load_matrix(EXAMPLES / "nightly.yaml")
    assert len(groups) == len(nightly.gpus)
    for gpu in nightly.gpus.values():
        import json
        [group] = [g for g in groups
                   if json.loads(json.loads(g["rayStartParams"]["resources"])) == {f"accelerator_type:{gpu.ray_label}": 1}]
        assert group["rayStartParams"]["num-gpus"] == str(gpu.count)
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == str(gpu.count)
        assert group["minReplicas"] == group["replicas"] == group["maxReplicas"]


@pytest.mark.slow
def test_ray_job_submit_example_runs_the_matrix_on_the_cluster(tmp_path, cluster):
    matrix = write_matrix(tmp_path, "jobsubmit", soak="5m")
    out = tmp_path / "out"
    env = {"RAY_DASHBOARD": f"http://127.0.0.1:{DASHBOARD_PORT['port']}",
           "SOAKMATRIX": f"{sys.executable} -m soakmatrix.matrix.cli",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for _ in range(6):   # the head's job agent comes up after the cluster, later still on a busy machine
        result = subprocess.run([str(CI / "ray-job-submit.sh"), str(matrix), "--out", str(out)], cwd=tmp_path,
                                capture_output=True, text=True, timeout=400, env={**os.environ, **env})
        if "No available agent to submit job" not in result.stderr + result.stdout:
            break
        time.sleep(10)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"on Ray cluster at {cluster}" in result.stdout   # it joined this cluster, started none
    with store_of(out) as store:
        results = store.results(store.latest_run_id())
    assert len(results) == 8 and all(r.outcome is Outcome.PASSED for r in results)
    assert_gone(str(out))


# -- progress on the terminal ------------------------------------------------------------------------

def _progress_fixture():
    import io

    from soakmatrix.matrix.contracts.result import CellResult
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    matrix = load_matrix(EXAMPLES / "demo.yaml")
    cells = plan(matrix).cells[:3]

    def result(pc, outcome, **kw):
        return CellResult(pc.id, pc.name, outcome, gpu_count=pc.gpu_count, started_at=0.0, ended_at=3600.0, **kw)
    return io.StringIO(), cells, result


def test_progress_in_a_log_is_one_plain_line_per_event_with_periodic_status():
    from soakmatrix.matrix.progress import Progress

    stream, cells, result = _progress_fixture()
    now = [0.0]
    progress = Progress(3, stream=stream, tty=False, clock=lambda: now[0], log_every_s=60)
    progress.cell_started(cells[0], 1, "node-a")
    progress.cell_started(cells[1], 1, "node-b")
    now[0] = 30
    progress.cell_finished(cells[0], result(cells[0], Outcome.HANG, signature="shm_broadcast_timeout",
                                            time_to_hang_s=480))
    progress.cell_retrying(cells[1], result(cells[1], Outcome.INFRA_ERROR, message="node lost"))
    now[0] = 61
    progress.tick()
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert lines[0].startswith("start ") and cells[0].name in lines[0]
    assert any(line.startswith("hang ") and "shm_broadcast_timeout" in line and "after 8m" in line for line in lines)
    assert any(line.startswith("retry ") and "node lost" in line for line in lines)
    status = [line for line in lines if line.startswith("status")]
    assert len(status) == 1 and "1/3 done" in status[0] and "1 hang" in status[0] and "1 retried" in status[0]
    assert "1/3 done" in lines[-1] and "GPU-h" in lines[-1]


def test_progress_on_a_tty_redraws_one_status_line_and_keeps_findings():
    from soakmatrix.matrix.progress import Progress

    stream, cells, result = _progress_fixture()
    now = [0.0]
    progress = Progress(3, stream=stream, tty=True, clock=lambda: now[0])
    progress.cell_started(cells[0], 1, "node-a")
    now[0] = 1800
    progress.tick()
    assert "1 running" in stream.getvalue() and "0.50 GPU-h" in stream.getvalue()   # half an hour on 1 GPU
    progress.cell_finished(cells[0], result(cells[0], Outcome.PASSED))
    progress.cell_finished(cells[1], result(cells[1], Outcome.CRASH, message="Traceback: boom"))
    progress.close()
    text = stream.getvalue()
    assert "\r\x1b[2K" in text
    kept = [line.split("\r\x1b[2K")[-1] for line in text.split("\n")[:-1]]   # what stays on screen
    assert any(line.startswith("crash ") and "boom" in line for line in kept)   # findings stay on screen
    assert not any(line.startswith("passed ") for line in kept)                 # passes only count
    assert "2/3 done" in text.split("\r\x1b[2K")[-1]


def test_progress_on_a_terminal_that_hangs_up_goes_on_as_plain_lines_in_the_output_folder(tmp_path):
    import errno
    import io

    from soakmatrix.matrix.lasting_stream import LastingStream
    from soakmatrix.matrix.progress import Progress

    class Terminal(io.StringIO):
        hung_up = False

        def isatty(self):
            return True

        def write(self, text):
            if self.hung_up:
                raise OSError(errno.EIO, "Input/output error")
            return super().write(text)

    _, cells, result = _progress_fixture()
    terminal = Terminal()
    now = [0.0]
    progress = Progress(3, stream=LastingStream(terminal, tmp_path / "progress.log"), clock=lambda: now[0])
    now[0] = 10
    progress.cell_started(cells[0], 1, "node-a")
    assert "\r\x1b[2K" in terminal.getvalue()          # a status line, redrawn in place
    terminal.hung_up = True
    progress.cell_started(cells[1], 1, "node-b")
    progress.cell_finished(cells[0], result(cells[0], Outcome.HANG, signature="shm_broadcast_timeout"))
    progress.cell_started(cells[2], 1, "node-a")      # the hang-up is known by now: a log's line
    progress.close()
    log = (tmp_path / "progress.log").read_text()
    assert "\r" not in log and "\x1b" not in log        # a log's plain lines from then on
    lines = log.splitlines()
    assert any(line.startswith("hang ") and "shm_broadcast_timeout" in line for line in lines)
    assert f"start    {cells[2].name}  (node node-a)" in lines and lines[-1].startswith("1/3 done | 2 running")


def test_a_store_that_is_not_a_history_store_is_a_usage_error_before_any_cell_runs(tmp_path):
    matrix = write_matrix(tmp_path, "store")
    store = tmp_path / "notes.sqlite"
    store.write_text("my notes, not a database\n")
    result = run_cli("run", str(matrix), "--out", str(tmp_path / "out"), "--store", str(store), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "--store" in result.stderr and "not a soakmatrix history store" in result.stderr
    assert "Traceback" not in result.stderr
    assert store.read_text() == "my notes, not a database\n"        # left as it was
    assert not (tmp_path / "out" / "cells").exists()                # nothing ran
