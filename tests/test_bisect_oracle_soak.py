"""The soak oracle (matrix/bisect/oracle_soak.py): each probe is a soak job of the failing cell's model,
GPU and workload through the run loop, with the probe's flags, soak length and its own engine seed;
a crash inside the restarting oracle starts a new job for the load still missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from soakmatrix.matrix.bisect.oracle import Probe
from soakmatrix.matrix.bisect.oracle_restart import RestartingOracle
from tests.scripted_launcher import ScriptedLauncher

FAILING = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"


def failing_cell(examples):
    from soakmatrix.matrix.bisect.setup import find_cell
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    matrix = load_matrix(str(examples / "demo.yaml"))
    result_plan = plan(matrix, None)
    return matrix, result_plan, find_cell(result_plan.cells, FAILING, matrix)


def test_on_the_soak_oracle_a_crash_starts_a_new_soak_job_for_the_load_still_missing(tmp_path, examples):
    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.contracts.result import CellResult

    matrix, result_plan, pc = failing_cell(examples)

    def script(spec, n):
        common = {"cell_id": spec.cell_id, "cell_name": spec.cell_name, "node": "n1"}
        if n == 1:
            return CellResult(outcome="crash", signature="crash", exposure_s=1000.0, time_to_hang_s=1000.0, **common)
        return CellResult(outcome="hang", signature="shm_broadcast_timeout", exposure_s=900.0, time_to_hang_s=500.0,
                          **common)

    launcher = ScriptedLauncher(script)
    inner = SoakOracle(matrix, result_plan.profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                       out_dir=tmp_path, launcher_factory=lambda: launcher)
    (r,) = RestartingOracle(inner, "shm_broadcast_timeout").run([Probe(pc.cell.flag_dict, 3600.0, "failing cell")])
    assert [s.soak_s for s in launcher.specs] == [3600.0, 2600.0]      # the second job soaks what is missing
    assert r.outcome == "hang" and r.signature == "shm_broadcast_timeout"
    assert r.exposure_s == pytest.approx(1500.0)                       # 1000 s before the crash + 500 s
    startup = result_plan.profile.startup_s
    assert r.gpu_hours == pytest.approx(2 * (2 * startup + 1500.0) / 3600.0)   # TP 2, two start-ups
    assert r.extra["other_signatures"] == {"crash": 1} and r.extra["cell_id"] == pc.id


def test_every_probe_soaks_with_its_own_engine_seed(tmp_path, examples):
    # the simulated engine draws its hang times from the seed: two probes of one config with one seed
    # would hang at the same moment, and pooled they would pass for two independent hangs
    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.contracts.result import CellResult

    matrix, result_plan, pc = failing_cell(examples)

    def script(spec, n):
        return CellResult(outcome="passed", cell_id=spec.cell_id, cell_name=spec.cell_name, node="n1",
                          exposure_s=spec.soak_s)

    def seeds_of(oracle_seed):
        launcher = ScriptedLauncher(script)
        oracle = SoakOracle(matrix, result_plan.profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                            out_dir=tmp_path / str(oracle_seed), launcher_factory=lambda: launcher, seed=oracle_seed)
        other = {**pc.cell.flag_dict, "mtp": 0}
        oracle.run([Probe(pc.cell.flag_dict, 600.0), Probe(pc.cell.flag_dict, 600.0), Probe(other, 600.0)])
        oracle.run([Probe(pc.cell.flag_dict, 600.0)])
        return [s.seed for s in launcher.specs]

    seeds = seeds_of(None)
    assert len(seeds) == 4 and len(set(seeds)) == 4          # the same config twice, in two rounds: all differ
    assert seeds_of(None) == seeds                           # and a rerun soaks with the same ones
    assert not set(seeds_of(7)) & set(seeds)                 # --seed moves them all


def test_probes_of_a_cell_on_a_build_soak_in_that_builds_runtime_env(tmp_path, examples):
    # the flag bisection of a cell on a build (a matrix with builds:, or --then-flags) runs every probe
    # on that build, not on the engine the nodes have
    import sys

    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.contracts.result import CellResult
    from soakmatrix.matrix.spec_types import Build

    matrix, result_plan, pc = failing_cell(examples)
    launcher = ScriptedLauncher(lambda spec, n: CellResult(outcome="passed", cell_id=spec.cell_id, cell_name=spec.cell_name,
                                                    node="n1", exposure_s=spec.soak_s))
    build = Build("first-bad", 3, "python", sys.executable, None)
    oracle = SoakOracle(matrix, result_plan.profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                        out_dir=tmp_path, launcher_factory=lambda: launcher, build=build)
    oracle.run([Probe(pc.cell.flag_dict, 600.0)])
    (spec,) = launcher.specs
    assert (spec.build, spec.build_ordinal) == ("first-bad", 3) and spec.cell_name.endswith("|first-bad")
    assert spec.runtime_env["py_executable"] == sys.executable
    assert spec.env["SOAKMATRIX_BUILD"] == "first-bad"


def test_probes_of_one_config_in_one_batch_soak_side_by_side_as_copies(tmp_path, examples):
    # the scheduler keys running cells by id: copies get their own id, name and artifacts folder, so
    # a batch with one config three times is one round of three jobs, not three rounds
    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.contracts.result import CellResult

    matrix, result_plan, pc = failing_cell(examples)

    def script(spec, n):
        return CellResult(outcome="passed", cell_id=spec.cell_id, cell_name=spec.cell_name, node="n1",
                          exposure_s=spec.soak_s)

    launcher = ScriptedLauncher(script)
    oracle = SoakOracle(matrix, result_plan.profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                        out_dir=tmp_path, launcher_factory=lambda: launcher)
    other = {**pc.cell.flag_dict, "mtp": 0}
    results = oracle.run([Probe(pc.cell.flag_dict, 600.0), Probe(other, 700.0), Probe(pc.cell.flag_dict, 800.0),
                          Probe(pc.cell.flag_dict, 900.0)])
    assert launcher.most_at_once == 4
    assert [r.exposure_s for r in results] == [600.0, 700.0, 800.0, 900.0]     # each answer to its probe
    ids = [s.cell_id for s in launcher.specs]
    assert len(set(ids)) == 4 and ids[0] == pc.id and ids[2:] == [f"{pc.id}.1", f"{pc.id}.2"]
    assert len({s.artifacts_dir for s in launcher.specs}) == 4
    assert all(s.flags == pc.cell.flag_dict for s in (launcher.specs[0], *launcher.specs[2:]))
    assert oracle.run([]) == []


def test_a_stopped_round_stops_the_bisection_instead_of_answering_infrastructure_errors(tmp_path, examples):
    # Ctrl-C or SIGTERM inside the run loop cancels the round's jobs; a cancelled probe is no answer:
    # read as an infrastructure error, the bisection would retry it and soak on
    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.contracts.result import CellResult

    matrix, result_plan, pc = failing_cell(examples)

    def script(spec, n):
        if n == 2:
            raise KeyboardInterrupt
        return CellResult(outcome="passed", cell_id=spec.cell_id, cell_name=spec.cell_name, node="n1",
                          exposure_s=spec.soak_s)

    oracle = SoakOracle(matrix, result_plan.profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                        out_dir=tmp_path, launcher_factory=lambda: ScriptedLauncher(script))
    with pytest.raises(KeyboardInterrupt):
        oracle.run([Probe(pc.cell.flag_dict, 600.0), Probe({**pc.cell.flag_dict, "mtp": 0}, 600.0)])


def test_a_resumed_oracle_numbers_its_rounds_and_seeds_after_the_replayed_ones(tmp_path, examples):
    from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
    from soakmatrix.matrix.contracts.result import CellResult

    matrix, result_plan, pc = failing_cell(examples)

    def script(spec, n):
        return CellResult(outcome="passed", cell_id=spec.cell_id, cell_name=spec.cell_name, node="n1",
                          exposure_s=spec.soak_s)

    def first_round(resumed, existing=()):
        launcher = ScriptedLauncher(script)
        out = tmp_path / str(resumed) / str(len(existing))
        for name in existing:
            (out / name).mkdir(parents=True)
        oracle = SoakOracle(matrix, result_plan.profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                            out_dir=out, launcher_factory=lambda: launcher, seed=7)
        if resumed:
            oracle.resume_after(3, 5)      # three rounds, five probes answered from the journal
        oracle.run([Probe(pc.cell.flag_dict, 600.0)])
        (spec,) = launcher.specs
        return spec.seed, Path(spec.artifacts_dir).relative_to(out).parts[0]

    fresh_seed, fresh_dir = first_round(False)
    seed, folder = first_round(True)
    assert (fresh_dir, folder) == ("probe-001", "probe-004")
    assert seed == fresh_seed + 5                             # the sixth probe's seed, not the first's again
    # a round that was stopped left its folder behind: the next one does not write into it
    assert first_round(True, existing=("probe-004",))[1] == "probe-005"
