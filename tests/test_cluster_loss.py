"""Losing the Ray head (or the driver's own node) mid-run: which errors mean the cluster is gone
(pure, on Ray's real exception classes), the loop ending with what finished, the bisection's soak
oracles stopping without journaling the lost round; then, slow, `soakmatrix run` on a real two-node
cluster whose head is killed mid-run, and its `--resume` on a cluster that is back."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from soakmatrix.matrix.contracts.outcomes import EXIT_INFRA, Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.schedule import ClusterLost, HeadUnreachable, cluster_lost, run_cells
from tests.scripted_launcher import ScriptedLauncher

ray_exceptions = pytest.importorskip("ray.exceptions")

# -- which errors mean the cluster is gone ---------------------------------------------------------


@pytest.mark.parametrize("exc, says", [
    (ray_exceptions.ActorUnavailableError("The actor 8e4f is unavailable: RpcError: failed to connect to all "
                                          "addresses; Connection refused rpc_code: 14.", None), "driver's own node"),
    (ray_exceptions.ActorDiedError(), "driver's own node"),
    (ray_exceptions.RaySystemError("the raylet is gone"), "RaySystemError: System error: the raylet is gone"),
    (ray_exceptions.RpcError("Socket closed", rpc_code=14), "RpcError: Socket closed"),
    (HeadUnreachable("nothing answers at its GCS address 10.0.0.1:6379: Connection refused"), "Ray head is gone"),
    (ConnectionError("Failed during this or a previous request."), "Ray Client connection dropped"),
])
def test_the_driver_losing_its_node_the_gcs_or_its_client_connection_is_a_lost_cluster(exc, says):
    why = cluster_lost(exc)
    assert why is not None and why.startswith("lost the Ray cluster") and says in why
    assert "\n" not in why


@pytest.mark.parametrize("exc", [
    ray_exceptions.GetTimeoutError("Get timed out"),        # a slow answer is no lost cluster
    ray_exceptions.TaskCancelledError(),
    ray_exceptions.WorkerCrashedError(),                     # a cell's own worker: that cell's infra error
    BrokenPipeError("progress reader went away"),            # a ConnectionError, but not Ray's
    ConnectionResetError("a server of ours"),
    ValueError("a bug of ours"),
    KeyboardInterrupt(),
])
def test_other_errors_are_not_a_lost_cluster(exc):
    assert cluster_lost(exc) is None


def test_a_long_ray_message_is_cut_to_one_short_line():
    why = cluster_lost(ray_exceptions.RaySystemError("x" * 2000 + "\nsecond line"))
    assert why is not None and len(why) < 320 and why.endswith("...") and "second line" not in why


# -- the loop, with a launcher that loses the cluster ----------------------------------------------

MATRIX = """
name: lost
models: {m: {path: org/m, mtp_head: true}}
gpus: {H200: {count: 2, memory_gb: 141, ray_label: H200}}
axes: {mtp: [0, 1], async_scheduling: [true, false]}
profiles: {p: {soak: 20m, startup: 5s, retries: 2}}
sim: {time_scale: 240}
"""


@pytest.fixture
def four_cells(tmp_path):
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.soak_specs import soak_spec_for
    from soakmatrix.matrix.spec import load_matrix

    matrix = load_matrix(str(tmp_path / "lost.yaml"), MATRIX)
    assert len(plan(matrix, "p").cells) == 4
    return matrix, plan(matrix, "p").cells, lambda pc: soak_spec_for(pc, matrix, "sim", tmp_path)


def passed(spec, n):
    return CellResult(spec.cell_id, spec.cell_name, Outcome.PASSED, node="n1", attempt=spec.attempt,
                      exposure_s=spec.soak_s)


class LosesTheCluster(ScriptedLauncher):
    """Answers jobs one per wait; after `answers` of them the driver's node is gone."""

    def __init__(self, answers: int, error: BaseException):
        super().__init__(passed, gpus=2)
        self.answers, self.error, self.cancelled = answers, error, []

    def wait(self, handles, timeout_s):
        return [h for h in handles if h in self._pending][:1]

    def started(self):
        if self.answers <= 0:
            raise self.error
        self.answers -= 1
        return []

    def cancel(self, handle, force):
        self.cancelled.append((handle, force))


class Events:
    def __init__(self, fail_with: BaseException | None = None):
        self.finished, self.fail_with = [], fail_with

    def cell_started(self, pc, attempt, node): ...
    def cell_retrying(self, pc, result): ...

    def cell_finished(self, pc, result):
        self.finished.append(result)

    def tick(self):
        if self.fail_with is not None and self.finished:
            raise self.fail_with


def test_a_lost_cluster_ends_the_loop_with_what_finished_and_the_rest_unfinished(four_cells):
    matrix, cells, make_spec = four_cells
    launcher = LosesTheCluster(2, ray_exceptions.ActorUnavailableError("The actor is unavailable", None))
    events = Events()
    t0 = time.monotonic()
    summary = run_cells(cells, make_spec, launcher, events, retries=2, cap_s=60, poll_s=0, grace_s=60)
    assert time.monotonic() - t0 < 5             # no grace period spent waiting on a cluster that is gone
    assert summary.lost is not None and "driver's own node" in summary.lost
    assert not summary.interrupted and len(summary.results) == 2 == len(events.finished)
    assert sorted(summary.unfinished) == sorted({pc.id for pc in cells} - {r.cell_id for r in summary.results})
    assert len(launcher.cancelled) == 2 and not any(force for _, force in launcher.cancelled)


def test_an_error_of_the_result_writers_is_raised_as_it_is_never_read_as_a_lost_cluster(four_cells):
    matrix, cells, make_spec = four_cells
    launcher = LosesTheCluster(10, ray_exceptions.RaySystemError("unused"))
    with pytest.raises(BrokenPipeError):
        run_cells(cells, make_spec, launcher, Events(fail_with=BrokenPipeError("gone")), retries=2, cap_s=60,
                  poll_s=0, grace_s=0.1)


# -- the bisection's soak oracles ---------------------------------------------------------------------

def test_a_flag_bisection_round_on_a_lost_cluster_is_not_journaled_and_a_resume_soaks_it_again(tmp_path, four_cells):
    from soakmatrix.matrix.bisect.journal import FLAG_CODEC, JournalingOracle, ProbeJournal
    from soakmatrix.matrix.bisect.oracle import Probe
    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.plan import plan

    matrix, cells, _ = four_cells
    profile, flags = plan(matrix, "p").profile, cells[0].cell.flag_dict
    lose = {"after": 2}

    def launcher():
        return LosesTheCluster(lose["after"], ray_exceptions.ActorUnavailableError("unavailable", None))

    def journaled_oracle(resume):
        soak = SoakOracle(matrix, profile, "m", "H200", "random", out_dir=tmp_path / "out", launcher_factory=launcher)
        journal = ProbeJournal(tmp_path / "journal-flags.jsonl", {"kind": "flags"}, resume=resume)
        return JournalingOracle(soak, journal, FLAG_CODEC), journal

    round_1 = [Probe(flags, 600.0)]
    round_2 = [Probe({**flags, "mtp": 1}, 600.0), Probe({**flags, "mtp": 1}, 600.0)]
    oracle, journal = journaled_oracle(resume=False)
    assert [r.outcome for r in oracle.run(round_1)] == ["passed"]
    with pytest.raises(ClusterLost, match="lost the Ray cluster"):
        oracle.run(round_2)                      # its first answer comes, then the driver's node is gone
    journal.close()

    lose["after"] = 10                           # the cluster is back
    oracle, journal = journaled_oracle(resume=True)
    assert len(journal.batches) == 1             # the lost round was not recorded as answers
    assert [r.outcome for r in oracle.run(round_1)] == ["passed"] and oracle.replayed == 1
    assert [r.outcome for r in oracle.run(round_2)] == ["passed", "passed"]
    journal.close()


def test_a_build_bisection_round_on_a_lost_cluster_raises_instead_of_answering_untestable(tmp_path):
    from soakmatrix.matrix.build_bisect.matrix_builds import to_builds
    from soakmatrix.matrix.build_bisect.oracle import BuildProbe
    from soakmatrix.matrix.build_bisect.oracle_soak import BuildSoakOracle
    from soakmatrix.matrix.build_bisect.specs import parse_builds_text
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix
    from tests.test_build_bisect_soak import UNIT_MATRIX

    matrix = load_matrix(str(tmp_path / "unit.yaml"), UNIT_MATRIX)
    result_plan = plan(matrix, None)
    (pc,) = result_plan.cells
    builds = to_builds(parse_builds_text(f"old: python:{sys.executable}\nnew: python:{sys.executable}\n"),
                       matrix.builds)
    oracle = BuildSoakOracle(matrix, result_plan.profile, pc, builds, out_dir=tmp_path / "out", seed=7,
                             hang_model=str(tmp_path / "h.yaml"),
                             launcher_factory=lambda: LosesTheCluster(0, HeadUnreachable("refused")))
    with pytest.raises(ClusterLost, match="Ray head is gone"):
        oracle.run([BuildProbe(0, "old", 600.0), BuildProbe(1, "new", 600.0)])


def test_the_bisect_command_ends_a_lost_cluster_as_one_line_exit_3_naming_the_kept_journal(tmp_path, monkeypatch,
                                                                                            capsys):
    from soakmatrix.matrix.cli import bisect as bisect_cli

    def lose(args):
        raise ClusterLost("lost the Ray cluster: the Ray head is gone (refused)")

    monkeypatch.setattr(bisect_cli, "_main", lose)
    code = bisect_cli.main(argparse.Namespace(out=str(tmp_path / "b"), virtual=False))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_INFRA and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "lost the Ray cluster" in err and str(tmp_path / "b") in err and "--resume" in err


# -- end to end: `soakmatrix run` on a cluster whose head is killed mid-run ----------------------------

HEALTHY = """
name: headlost
models: {m: {path: org/m}}
gpus: {H200: {count: 2, memory_gb: 141, ray_label: H200}}
axes: {cudagraph_mode: [FULL_DECODE_ONLY, PIECEWISE, FULL_AND_PIECEWISE]}
workloads: {steady: {kind: random, concurrency: 4}}
profiles: {p: {soak: 12m, startup: 5s, workloads: [steady], retries: 1}}
sim: {time_scale: 150}
"""
# 4.8 s of wall time per cell; at 150 (the demo's) a stall of the loaded machine is no false hang


def two_node_cluster():
    """A head without GPUs (the node the CLI's driver attaches to, as `ray job submit` puts it there)
    and one node with 2 simulated H200s; this process is not its driver."""
    import ray
    from tests.conftest import start_ray_cluster

    cluster, _ = start_ray_cluster({"num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
                                   {"h200": dict(num_cpus=1, num_gpus=2, resources={"accelerator_type:H200": 1})})
    ray.shutdown()
    return cluster


def kill_head(cluster) -> list[psutil.Process]:
    """SIGKILL every process of the head node at once, as when its machine is lost: the GCS first,
    then the raylet and what runs under it (its agents, the workers of the actors placed there)."""
    procs = []
    for infos in cluster.head_node.all_processes.values():
        for info in infos:
            try:
                proc = psutil.Process(info.process.pid)
                procs += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
    procs.sort(key=lambda p: "gcs_server" not in " ".join(_cmdline(p)))
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return procs


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _results(out: Path):
    from soakmatrix.reports.history import HistoryStore

    with HistoryStore(out / "history.sqlite") as store:
        [run] = store.runs()
        return run, {r.cell_id: r for r in store.results(run.id)}, store.planned_cell_ids(run.id)


@pytest.mark.slow
def test_losing_the_ray_head_mid_run_keeps_what_finished_and_resume_runs_the_rest(tmp_path):
    from tests.conftest import REPO
    from tests.test_cluster import ray_processes_of
    from tests.test_run_cli import CLI, assert_gone

    matrix = tmp_path / "headlost.yaml"
    matrix.write_text(HEALTHY)
    out = tmp_path / "out"
    clusters = [two_node_cluster()]
    try:
        driver = subprocess.Popen([*CLI, "run", str(matrix), "--out", str(out), "--ray-address",
                                   clusters[0].address], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            deadline, finished = time.time() + 120, 0
            while time.time() < deadline and driver.poll() is None and finished < 1:
                time.sleep(0.3)
                if (out / "history.sqlite").exists():
                    finished = len(_results(out)[1])
            assert driver.poll() is None and finished >= 1, "the run ended before its head could be killed"
            kill_head(clusters[0])
            killed_at = time.time()
            ended: dict = {}

            def wind_down() -> None:
                ended["stderr"] = driver.communicate(timeout=90)[1]
                ended["at"] = time.time()

            waiter = threading.Thread(target=wind_down)
            waiter.start()
            clusters.append(two_node_cluster())   # the cluster comes back (a new head) while the driver ends
            waiter.join(100)
        finally:
            driver.kill()
        stderr = ended.get("stderr", "")
        took = ended.get("at", float("inf")) - killed_at
        print(f"the driver ended {took:.1f} s after its head was killed")

        assert driver.returncode == EXIT_INFRA, stderr
        assert "Traceback" not in stderr, stderr
        [lost] = [line for line in stderr.splitlines() if "lost the Ray cluster" in line]
        assert lost.startswith("soakmatrix run: lost the Ray cluster") and "--resume" in lost
        assert "results: " in stderr and "JUnit: " in stderr and "history: " in stderr
        assert took < 60   # Ray itself ends a driver that cannot reach its GCS after 60 s
        run, before, planned = _results(out)
        assert run.status is None and 1 <= len(before) < len(planned) == 3   # open, for --resume
        assert all(r.outcome is Outcome.PASSED for r in before.values()), [r.message for r in before.values()]
        in_junit = {c.get("name") for c in ET.parse(out / "junit.xml").getroot().iter("testcase")}
        assert in_junit == {r.cell_name for r in before.values()}

        clusters[0].shutdown()                   # what the lost head left: the GPU node's raylet
        resumed = subprocess.run([*CLI, "run", str(matrix), "--out", str(out), "--ray-address",
                                  clusters[1].address, "--resume"], cwd=REPO, capture_output=True, text=True,
                                 timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        assert f"{len(before)} already have a verdict" in resumed.stderr
        run, after, planned = _results(out)
        assert run.status == "finished" and set(after) == set(planned)
        for cell_id, result in before.items():   # none rerun
            assert after[cell_id].started_at == result.started_at
            assert f"start    {result.cell_name}" not in resumed.stderr
        assert all(r.outcome is Outcome.PASSED for r in after.values())
    finally:
        for cluster in clusters:
            cluster.shutdown()
        psutil.wait_procs(ray_processes_of(os.getpid()), timeout=30)
    assert ray_processes_of(os.getpid()) == [], "Ray processes left behind"
    assert_gone(str(out))                        # every simulated server
