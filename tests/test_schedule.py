"""Scheduling: placement, retries, caps and cancellation; pure first, then on a multi-node Ray cluster."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.schedule import (
    Node,
    avoid_on_retry,
    avoid_selector,
    cap_seconds,
    dispatch_order,
    infra_result,
    lower_bound_makespan,
    nodes_from_ray,
    overran,
    placement_problem,
    run_cells,
    run_with_cap,
    should_retry,
    unplaceable,
    with_assigned_gpus,
)
from soakmatrix.matrix.soak_specs import soak_spec_for
from soakmatrix.matrix.spec import load_matrix

FLEET_YAML = """
name: fleet
models: {m: {path: org/m, mtp_head: true}}
gpus:
  H200: {count: 8, memory_gb: 141, ray_label: H200}
  H20: {count: 8, memory_gb: 96, ray_label: H20}
  RTX5090: {count: 1, memory_gb: 32, ray_label: GeForce-RTX-5090}
axes: {tp: [1, 2, 8], mtp: [0, 1]}
profiles: {p: {soak: 2s, startup: 1s, retries: 2}}
"""


@pytest.fixture(scope="module")
def fleet():
    matrix = load_matrix("fleet.yaml", FLEET_YAML)
    return matrix, plan(matrix, "p").cells


def cell(cells, gpu, tp, mtp=0):
    return next(pc for pc in cells if pc.cell.gpu == gpu and pc.gpu_count == tp and pc.cell.flag_dict["mtp"] == mtp)


def spec_of(matrix, pc, backend="sim", **kw):
    return soak_spec_for(pc, matrix, backend, "/tmp/soak-test", **kw)


def passed(spec, **kw):
    return CellResult(spec.cell_id, spec.cell_name, Outcome.PASSED, gpu_count=spec.gpu_count,
                      started_at=time.time(), ended_at=time.time(), attempt=spec.attempt, **kw)


# -- pure decisions ---------------------------------------------------------------------------------

NODES = [Node("a", 8, frozenset({"H200"})), Node("b", 8, frozenset({"H200"})),
         Node("c", 1, frozenset({"GeForce-RTX-5090"})), Node("d", 8, frozenset({"H20"}), alive=False)]


def test_nodes_from_ray_reads_gpus_and_accelerator_labels():
    nodes = nodes_from_ray([
        {"NodeID": "n1", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 8.0, "accelerator_type:H200": 1.0}},
        {"NodeID": "n2", "Alive": False, "Resources": {"CPU": 2.0}},
    ])
    assert nodes == [Node("n1", 8.0, frozenset({"H200"})), Node("n2", 0.0, frozenset(), alive=False)]


def test_placement_reports_missing_type_and_too_few_gpus(fleet):
    _, cells = fleet
    assert placement_problem(cell(cells, "H200", 8), NODES) is None
    assert "accelerator_type:H20" in placement_problem(cell(cells, "H20", 1), NODES)   # only a dead H20 node
    small = [Node("a", 4, frozenset({"H200"}))]
    assert "needs 8 H200 GPUs on one node; the largest such node has 4" in placement_problem(cell(cells, "H200", 8), small)
    never = unplaceable(cells, NODES)
    assert {pc.id for pc in cells if pc.cell.gpu == "H20"} == set(never)


def test_dispatch_order_puts_big_cells_first(fleet):
    _, cells = fleet
    order = dispatch_order(cells)
    assert [pc.gpu_count for pc in order] == sorted((pc.gpu_count for pc in cells), reverse=True)


def test_retry_policy_only_infra_errors_and_only_up_to_the_limit(fleet):
    matrix, cells = fleet
    spec = spec_of(matrix, cells[0])
    infra = infra_result(spec, "node lost")
    assert should_retry(infra, 2)
    assert not should_retry(replace(infra, attempt=3), 2)
    assert should_retry(replace(infra, attempt=2), 2)
    for outcome in (Outcome.HANG, Outcome.CRASH, Outcome.PASSED, Outcome.CONFIG_ERROR):
        assert not should_retry(replace(infra, outcome=outcome), 5)


def test_avoid_on_retry_avoids_failed_nodes_only_while_another_can_host(fleet):
    _, cells = fleet
    h200 = cell(cells, "H200", 2)
    assert avoid_on_retry(h200, ["a"], NODES) == frozenset({"a"})
    assert avoid_on_retry(h200, ["a", "b"], NODES) == frozenset()   # nowhere else: retry anywhere
    assert avoid_on_retry(cell(cells, "RTX5090", 1), ["c"], NODES) == frozenset()
    assert avoid_selector({"x"}) == {"ray.io/node-id": "!x"}
    assert avoid_selector({"y", "x"}) == {"ray.io/node-id": "!in(x,y)"}


def test_cap_and_overrun():
    assert cap_seconds(600, 300, None) == 1500
    assert cap_seconds(600, 300, 100) == 100
    assert cap_seconds(2400, 120, None, time_scale=120) == 20 + 120 + 600   # sim: soak is engine time
    assert cap_seconds(2400, 120, 1200, time_scale=120) == 10
    assert not overran(None, 1e9, 10, 5)
    assert not overran(100, 114, 10, 5)
    assert overran(100, 116, 10, 5)


def test_lower_bound_makespan_is_the_busiest_gpu_type(fleet):
    _, cells = fleet
    gpus = {"H200": 16, "H20": 8, "GeForce-RTX-5090": 4}
    bound = lower_bound_makespan(cells, gpus)
    per_type = {}
    for pc in cells:
        per_type[pc.ray_label] = per_type.get(pc.ray_label, 0) + pc.gpu_count * 3
    assert bound == pytest.approx(max(w / gpus[k] for k, w in per_type.items()))


def test_assigned_gpus_reach_the_real_engine_only(fleet):
    matrix, cells = fleet
    spec = spec_of(matrix, cell(cells, "H200", 2))
    assert with_assigned_gpus(spec, [3, 5]) is spec
    real = with_assigned_gpus(replace(spec, backend="vllm"), [3, 5])
    assert real.env["CUDA_VISIBLE_DEVICES"] == "3,5"


# -- run_with_cap: the task body ----------------------------------------------------------------------

def test_run_with_cap_returns_the_result(fleet):
    matrix, cells = fleet
    spec = spec_of(matrix, cells[0])
    result = run_with_cap(lambda s, stop, on_event: passed(s), spec, cap_s=30)
    assert result.outcome is Outcome.PASSED


def test_run_with_cap_stops_an_overrunning_cell_as_infra_error(fleet):
    matrix, cells = fleet
    spec = spec_of(matrix, cells[0])
    stopped = threading.Event()

    def slow(s, stop, on_event):
        stop.wait(60)
        stopped.set()   # the soak job tears down when asked
        return passed(s)

    t0 = time.time()
    result = run_with_cap(slow, spec, cap_s=0.5, grace_s=10, poll_s=0.05)
    assert result.outcome is Outcome.INFRA_ERROR and "hard cap" in result.message
    assert stopped.is_set() and time.time() - t0 < 10


def test_run_with_cap_turns_an_exception_into_infra_error(fleet):
    matrix, cells = fleet

    def broken(s, stop, on_event):
        raise RuntimeError("port 8000 taken")

    result = run_with_cap(broken, spec_of(matrix, cells[0]), cap_s=5)
    assert result.outcome is Outcome.INFRA_ERROR and "port 8000 taken" in result.message


def test_run_with_cap_on_interrupt_tears_down_then_reraises(fleet):
    import _thread

    matrix, cells = fleet
    spec = spec_of(matrix, cells[0])
    torn_down = threading.Event()

    def soak(s, stop, on_event):
        _thread.interrupt_main()   # Ray's cancel, once the cell runs
        stop.wait(60)
        torn_down.set()
        return passed(s)

    with pytest.raises(KeyboardInterrupt):
        run_with_cap(soak, spec, cap_s=60, poll_s=0.05)
    assert torn_down.is_set()


def test_run_with_cap_interrupted_while_its_thread_starts_still_tears_down(fleet, monkeypatch):
    """On a busy machine the interrupt can land in Thread.start(), which waits for the new thread:
    the cell runs by then and must be torn down all the same (a clean-clone run saw it missed)."""
    matrix, cells = fleet
    spec = spec_of(matrix, cells[0])
    torn_down = threading.Event()
    start = threading.Thread.start

    def start_then_interrupted(thread):
        start(thread)
        if thread.name.startswith("soak-"):
            raise KeyboardInterrupt

    def soak(s, stop, on_event):
        stop.wait(60)
        torn_down.set()
        return passed(s)

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_with_cap(soak, spec, cap_s=60, poll_s=0.05)
    assert torn_down.is_set()


# -- run_cells with a fake launcher --------------------------------------------------------------------

class FakeLauncher:
    """Runs each submitted cell through `script(spec, node)` at the next wait()."""

    def __init__(self, nodes, script, pick_node=None):
        self._nodes = nodes
        self.script = script
        self.pick = pick_node or (lambda spec, label, avoid: next(
            n.node_id for n in self._nodes if n.alive and label in n.accelerators and n.node_id not in avoid))
        self.submitted, self.cancelled = [], []
        self._pending, self._started, self._n = {}, [], 0

    def submit(self, spec, ray_label, avoid_nodes, cap_s):
        self._n += 1
        node = self.pick(spec, ray_label, avoid_nodes)
        self.submitted.append((spec.cell_id, spec.attempt, node, avoid_nodes))
        self._pending[self._n] = (spec, node)
        self._started.append((spec.cell_id, spec.attempt, node, time.time()))
        return self._n

    def wait(self, handles, timeout_s):
        return [h for h in handles if h in self._pending]

    def result(self, handle):
        spec, node = self._pending.pop(handle)
        outcome = self.script(spec, node)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def cancel(self, handle, force):
        self.cancelled.append((handle, force))
        self._pending.pop(handle, None)

    def nodes(self):
        return list(self._nodes)

    def started(self):
        out, self._started = self._started, []
        return out


class Recorder:
    def __init__(self):
        self.started, self.retrying, self.finished = [], [], []

    def cell_started(self, pc, attempt, node):
        self.started.append((pc.id, attempt, node))

    def cell_retrying(self, pc, result):
        self.retrying.append(result)

    def cell_finished(self, pc, result):
        self.finished.append(result)

    def tick(self):
        pass


def test_run_cells_retries_a_lost_node_elsewhere_and_never_retries_a_hang(fleet):
    matrix, cells = fleet
    h200 = [pc for pc in cells if pc.cell.gpu == "H200"]
    flaky = cell(cells, "H200", 2, 0)
    hanging = cell(cells, "H200", 8, 1)

    def script(spec, node):
        if spec.cell_id == flaky.id and node == "a":
            return RuntimeError("NodeDiedError: node a died")
        if spec.cell_id == hanging.id:
            return replace(passed(spec), outcome=Outcome.HANG, signature="shm_broadcast_timeout")
        return passed(spec)

    launcher = FakeLauncher(NODES, script, pick_node=lambda spec, label, avoid: "b" if "a" in avoid else "a")
    rec = Recorder()
    summary = run_cells(h200, lambda pc: spec_of(matrix, pc), launcher, rec, retries=2, cap_s=60, poll_s=0)
    assert sorted(r.cell_id for r in summary.results) == sorted(pc.id for pc in h200)
    final = {r.cell_id: r for r in summary.results}
    assert final[flaky.id].outcome is Outcome.PASSED and final[flaky.id].attempt == 2
    assert final[flaky.id].node == "b"
    assert len(final[flaky.id].retries) == 1 and "node a died" in final[flaky.id].retries[0]
    assert (flaky.id, 2, "b", frozenset({"a"})) in launcher.submitted
    assert final[hanging.id].outcome is Outcome.HANG
    assert [s for s in launcher.submitted if s[0] == hanging.id] == [(hanging.id, 1, "a", frozenset())]
    assert len(rec.retrying) == 1 and len(rec.finished) == len(h200)


def test_run_cells_gives_up_after_the_retry_limit(fleet):
    matrix, cells = fleet
    pc = cell(cells, "H200", 1)
    launcher = FakeLauncher(NODES, lambda spec, node: RuntimeError("WorkerCrashedError: killed"))
    summary = run_cells([pc], lambda pc: spec_of(matrix, pc), launcher, Recorder(), retries=2, cap_s=60, poll_s=0)
    [result] = summary.results
    assert result.outcome is Outcome.INFRA_ERROR and result.attempt == 3
    assert len(result.retries) == 2
    assert len(launcher.submitted) == 3


def test_run_cells_fail_fast_cancels_the_rest(fleet):
    matrix, cells = fleet
    h200 = [pc for pc in cells if pc.cell.gpu == "H200"]

    class OneAtATime(FakeLauncher):
        def wait(self, handles, timeout_s):
            live = [h for h in handles if h in self._pending]
            return [min(live)] if live else []

    launcher = OneAtATime(NODES, lambda spec, node: replace(passed(spec), outcome=Outcome.CRASH))
    summary = run_cells(h200, lambda pc: spec_of(matrix, pc), launcher, Recorder(), retries=2, cap_s=60,
                        poll_s=0, fail_fast=True, grace_s=1)
    assert summary.stopped_early and len(summary.results) == 1
    assert len(summary.unfinished) == len(h200) - 1
    assert {h for h, force in launcher.cancelled if not force} == set(range(2, len(h200) + 1))


def test_run_cells_kills_a_task_past_its_cap_as_infra_error(fleet):
    matrix, cells = fleet
    pc = cell(cells, "H200", 1)
    now = [0.0]

    class Stuck(FakeLauncher):
        def wait(self, handles, timeout_s):
            now[0] += 50
            return [h for h, force in self.cancelled if force and h in handles]

        def result(self, handle):
            raise RuntimeError("TaskCancelledError")

        def cancel(self, handle, force):
            self.cancelled.append((handle, force))

        def started(self):
            return [(cid, att, node, 0.0) for cid, att, node, _ in super().started()]

    launcher = Stuck(NODES, None)
    summary = run_cells([pc], lambda pc: spec_of(matrix, pc), launcher, Recorder(), retries=0, cap_s=60,
                        poll_s=0, grace_s=30, clock=lambda: now[0])
    [result] = summary.results
    assert result.outcome is Outcome.INFRA_ERROR and "hard cap" in result.message
    assert (1, True) in launcher.cancelled


# -- on a multi-node Ray cluster -----------------------------------------------------------------------

def sleepy_run_cell(spec, stop=None, on_event=None):
    """A stand-in soak job: holds its GPUs for `soak_s` seconds, notes what it was given."""
    import os

    import ray

    t0 = time.time()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    if stop is not None:
        stop.wait(spec.soak_s)
    else:
        time.sleep(spec.soak_s)
    return CellResult(spec.cell_id, spec.cell_name, Outcome.PASSED, gpu_type=spec.gpu_type,
                      gpu_count=spec.gpu_count, started_at=t0, ended_at=time.time(), attempt=spec.attempt,
                      # what the test checks, in the one free-form field a result has
                      artifacts={"gpu_ids": ",".join(gpu_ids), "cuda_visible": spec.env.get("CUDA_VISIBLE_DEVICES", ""),
                                 "pid": str(os.getpid()), "stopped": str(bool(stop and stop.is_set()))})


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from tests.conftest import start_ray_cluster
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster, nodes = start_ray_cluster({"num_cpus": 1, "num_gpus": 0, "include_dashboard": False}, {
        "h200-a": dict(num_cpus=1, num_gpus=8, resources={"accelerator_type:H200": 1}),
        "h200-b": dict(num_cpus=1, num_gpus=8, resources={"accelerator_type:H200": 1}),
        "rtx": dict(num_cpus=1, num_gpus=1, resources={"accelerator_type:GeForce-RTX-5090": 1}),
    })
    try:
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        import os

        import psutil
        from tests.test_cluster import ray_processes_of

        psutil.wait_procs(ray_processes_of(os.getpid()), timeout=30)
        assert ray_processes_of(os.getpid()) == [], "Ray processes left behind"


def label_of(node_id):
    import ray

    [info] = [n for n in ray.nodes() if n["NodeID"] == node_id]
    return next(k.split(":", 1)[1] for k in info["Resources"] if k.startswith("accelerator_type:"))


@pytest.mark.slow
def test_ray_places_cells_by_type_and_count_without_sharing_gpus(ray_cluster, fleet):
    from soakmatrix.matrix.schedule import RayLauncher

    matrix, cells = fleet
    chosen = [pc for pc in cells if pc.cell.gpu in ("H200", "RTX5090")]
    rec = Recorder()
    launcher = RayLauncher(run_cell=sleepy_run_cell)
    never = unplaceable(chosen, launcher.nodes())
    assert set(never) == {pc.id for pc in chosen if pc.cell.gpu == "RTX5090" and pc.gpu_count > 1}
    runnable = [pc for pc in chosen if pc.id not in never]
    summary = run_cells(runnable, lambda pc: spec_of(matrix, pc, backend="vllm", soak_s=2.0), launcher, rec,
                        retries=0, cap_s=120, poll_s=0.2)
    assert len(summary.results) == len(runnable)
    by_id = {pc.id: pc for pc in runnable}
    for r in summary.results:
        pc = by_id[r.cell_id]
        assert r.outcome is Outcome.PASSED
        assert label_of(r.ray_node_id) == pc.ray_label
        assert len(r.artifacts["gpu_ids"].split(",")) == pc.gpu_count
        assert r.artifacts["cuda_visible"] == r.artifacts["gpu_ids"]
    # no GPU held by two cells at once
    for a in summary.results:
        for b in summary.results:
            if a is b or a.ray_node_id != b.ray_node_id:
                continue
            overlap = min(a.ended_at, b.ended_at) - max(a.started_at, b.started_at)
            if overlap > 0.05:
                assert not set(a.artifacts["gpu_ids"].split(",")) & set(b.artifacts["gpu_ids"].split(",")), \
                    (a.cell_name, b.cell_name)


@pytest.mark.slow
def test_ray_node_lost_mid_cell_is_infra_error_then_retried_elsewhere(ray_cluster, fleet):
    import ray

    from soakmatrix.matrix.schedule import RayLauncher

    cluster, nodes = ray_cluster
    matrix, cells = fleet
    extra = cluster.add_node(num_cpus=1, num_gpus=8, resources={"accelerator_type:H20": 1})
    spare = cluster.add_node(num_cpus=1, num_gpus=8, resources={"accelerator_type:H20": 1})
    cluster.wait_for_nodes()
    by_id = {n.node_id: n for n in (extra, spare)}
    pc = cell(cells, "H20", 8)
    removed = []

    class RemoveNodeOnStart(Recorder):
        def cell_started(self, pc_, attempt, node):
            super().cell_started(pc_, attempt, node)
            if attempt == 1:
                removed.append(node)
                cluster.remove_node(by_id[node])

    rec = RemoveNodeOnStart()
    try:
        summary = run_cells([pc], lambda pc: spec_of(matrix, pc, soak_s=6.0), RayLauncher(run_cell=sleepy_run_cell),
                            rec, retries=2, cap_s=120, poll_s=0.2)
        [result] = summary.results
        assert removed and len(rec.retrying) == 1
        assert rec.retrying[0].outcome is Outcome.INFRA_ERROR
        assert result.outcome is Outcome.PASSED and result.attempt == 2
        assert result.ray_node_id != removed[0]
        assert len(result.retries) == 1 and "attempt 1" in result.retries[0]
    finally:
        for node in (extra, spare):
            if node.node_id not in removed:
                cluster.remove_node(node)
        ray.nodes()


@pytest.mark.slow
def test_ray_cancel_stops_running_cells_cleanly(ray_cluster, fleet):
    from soakmatrix.matrix.schedule import RayLauncher

    matrix, cells = fleet
    pcs = [cell(cells, "H200", 1, 0), cell(cells, "H200", 1, 1)]
    launcher = RayLauncher(run_cell=sleepy_run_cell)

    class InterruptWhenBothRun(Recorder):
        def tick(self):
            if len(self.started) == 2:
                raise KeyboardInterrupt

    t0 = time.time()
    summary = run_cells(pcs, lambda pc: spec_of(matrix, pc, soak_s=300.0), launcher, InterruptWhenBothRun(),
                        retries=0, cap_s=600, poll_s=0.2, grace_s=30)
    assert summary.interrupted and summary.results == []
    assert sorted(summary.unfinished) == sorted(pc.id for pc in pcs)
    assert time.time() - t0 < 120   # stopped long before the 300 s soak


def test_run_cells_gives_up_a_waiting_cell_whose_gpu_type_is_gone(fleet):
    matrix, cells = fleet
    rtx = cell(cells, "RTX5090", 1)
    now = [0.0]

    class NodeGone(FakeLauncher):
        """The RTX node is lost before the cell starts: the task would wait for ever."""

        def submit(self, spec, ray_label, avoid_nodes, cap_s):
            handle = super().submit(spec, ray_label, avoid_nodes, cap_s)
            self._started.clear()
            return handle

        def wait(self, handles, timeout_s):
            now[0] += 20
            return [h for h, _ in self.cancelled if h in handles]

        def result(self, handle):
            raise RuntimeError("TaskCancelledError")

        def cancel(self, handle, force):
            self.cancelled.append((handle, force))

    launcher = NodeGone([n for n in NODES if "GeForce-RTX-5090" not in n.accelerators], None,
                        pick_node=lambda spec, label, avoid: "")
    summary = run_cells([rtx], lambda pc: spec_of(matrix, pc), launcher, Recorder(), retries=2, cap_s=600,
                        poll_s=0, recheck_s=30, stranded_grace_s=60, clock=lambda: now[0])
    [result] = summary.results
    assert result.outcome is Outcome.INFRA_ERROR and result.message.startswith("never placed: ")
    assert "accelerator_type:GeForce-RTX-5090" in result.message
    assert len(launcher.submitted) == 1          # not retried: nowhere to retry
    assert 60 <= now[0] <= 200


def test_run_cells_cancels_everything_when_recording_a_result_fails(fleet):
    matrix, cells = fleet
    h200 = [pc for pc in cells if pc.cell.gpu == "H200"][:3]

    class OneAtATime(FakeLauncher):
        def wait(self, handles, timeout_s):
            live = [h for h in handles if h in self._pending]
            return [min(live)] if live else []

    class DiskFull(Recorder):
        def cell_finished(self, pc, result):
            raise OSError("disk full")

    launcher = OneAtATime(NODES, lambda spec, node: passed(spec))
    with pytest.raises(OSError, match="disk full"):
        run_cells(h200, lambda pc: spec_of(matrix, pc), launcher, DiskFull(), retries=0, cap_s=60, poll_s=0,
                  grace_s=1)
    assert {h for h, force in launcher.cancelled if not force} == {2, 3}


def dies_on_first_attempt(spec, stop=None, on_event=None):
    """A soak job whose worker process is killed on the first attempt (OOM killer, segfault)."""
    import os
    import signal

    if spec.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return sleepy_run_cell(spec, stop, on_event)


@pytest.mark.slow
def test_ray_killed_worker_is_infra_error_and_retried(ray_cluster, fleet):
    from soakmatrix.matrix.schedule import RayLauncher

    matrix, cells = fleet
    pc = cell(cells, "H200", 1)
    rec = Recorder()
    summary = run_cells([pc], lambda pc: spec_of(matrix, pc, soak_s=0.5), RayLauncher(run_cell=dies_on_first_attempt),
                        rec, retries=1, cap_s=120, poll_s=0.2)
    [result] = summary.results
    assert [r.outcome for r in rec.retrying] == [Outcome.INFRA_ERROR]
    assert "Worker" in rec.retrying[0].message or "died" in rec.retrying[0].message.lower()
    assert result.outcome is Outcome.PASSED and result.attempt == 2 and len(result.retries) == 1


def starts_an_engine_then_dies(spec, stop=None, on_event=None):
    """A soak job whose worker is SIGKILLed mid-cell (OOM killer, forced cancel) on the first attempt,
    after its engine started: a server in a session of its own with a child of its own, as vLLM's
    API server and engine core are. Their pids go to `<artifacts>/engine.pids`."""
    import os
    import signal

    import psutil

    from soakmatrix.jobs import server_process
    from soakmatrix.jobs.engines.protocol import LaunchCommand

    if spec.attempt == 1:
        child = "import time; time.sleep(120)"
        argv = [sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                                      f"{child!r}]); time.sleep(120)"]
        server = server_process.start(LaunchCommand(argv), spec.artifacts_dir, "127.0.0.1", 0, extra_env=spec.env)
        deadline = time.time() + 20
        while not psutil.Process(server.process.pid).children() and time.time() < deadline:
            time.sleep(0.1)
        pids = [server.process.pid, *(c.pid for c in psutil.Process(server.process.pid).children())]
        Path(spec.artifacts_dir, "engine.pids").write_text(" ".join(map(str, pids)))
        time.sleep(1.5)   # the reaper looks at each new process within 0.5 s
        os.kill(os.getpid(), signal.SIGKILL)
    return sleepy_run_cell(spec, stop, on_event)


@pytest.mark.slow
def test_ray_worker_killed_mid_cell_leaves_no_engine_behind(ray_cluster, fleet, tmp_path):
    import psutil
    from tests.conftest import running

    from soakmatrix.matrix.schedule import RayLauncher

    matrix, cells = fleet
    pc = cell(cells, "H200", 1)
    spec = soak_spec_for(pc, matrix, "sim", str(tmp_path), soak_s=0.5)
    summary = run_cells([pc], lambda pc: spec, RayLauncher(run_cell=starts_an_engine_then_dies), Recorder(),
                        retries=1, cap_s=120, poll_s=0.2)
    [result] = summary.results
    assert result.outcome is Outcome.PASSED and result.attempt == 2
    pids = [int(p) for p in (Path(spec.artifacts_dir) / "engine.pids").read_text().split()]
    assert len(pids) == 2   # the server and its child
    engines = []
    for pid in pids:
        try:
            engines.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(engines, timeout=20)
    left = [p for p in alive if running(p)]
    for p in left:
        p.kill()
    assert [p.pid for p in left] == [], "the killed worker's engine lives on"



def first_node_fails_its_preflight(folder, backend, expected, indices):
    """A stand-in doctor: the first node it runs on fails (a marker made atomically says which), the
    others pass; every run is counted per node."""
    import os

    import ray

    node = ray.get_runtime_context().get_node_id()
    with open(os.path.join(folder, f"doctor-{node}"), "a") as fh:
        fh.write("x")
    try:
        fd = os.open(os.path.join(folder, "bad-node"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, node.encode())
        os.close(fd)
    except FileExistsError:
        pass
    bad = open(os.path.join(folder, "bad-node")).read()
    status = "fail" if node == bad else "ok"
    return {"node": node, "backend": backend, "ok": status == "ok", "notes": [],
            "checks": [{"name": "shm", "status": status, "detail": f"/dev/shm on {node[:8]}"}]}


@pytest.mark.slow
def test_ray_a_node_that_fails_its_preflight_refuses_its_cells_and_each_node_is_checked_once(
        ray_cluster, fleet, tmp_path):
    from functools import partial

    from soakmatrix.matrix.schedule import RayLauncher

    matrix, cells = fleet
    pcs = [cell(cells, "H200", 8, 0), cell(cells, "H200", 8, 1)]
    launcher = RayLauncher(run_cell=sleepy_run_cell, diagnose=partial(first_node_fails_its_preflight, str(tmp_path)))
    rec = Recorder()
    summary = run_cells(pcs, lambda pc: spec_of(matrix, pc, backend="vllm", soak_s=1.0), launcher, rec,
                        retries=2, cap_s=120, poll_s=0.2)
    bad = (tmp_path / "bad-node").read_text()
    assert [r.outcome for r in summary.results] == [Outcome.PASSED, Outcome.PASSED]
    refused = [r for r in rec.retrying if "failed its preflight" in r.message]
    assert refused and all(r.outcome is Outcome.INFRA_ERROR and r.ray_node_id == bad for r in refused)
    assert refused[0].message.endswith(f"shm: /dev/shm on {bad[:8]}")
    assert refused[0].preflight["checks"][0]["status"] == "fail"
    for r in summary.results:
        assert r.ray_node_id != bad and r.preflight["ok"]
    # once per node per run, however many cells went there
    counts = {p.name: len(p.read_text()) for p in tmp_path.glob("doctor-*")}
    assert set(counts.values()) == {1} and f"doctor-{bad}" in counts, counts
