"""Build probes of real builds: each probe is a soak job of the failing cell on one build, scheduled
on Ray by the same loop as `soakmatrix run` (`matrix.schedule.run_cells` with a `RayLauncher`).

The probe's planned cell is the failing cell's model, GPU type, flags and workload with the probe's
build (`matrix.plan.planned_cell(..., build)`), so `matrix.soak_specs.soak_spec_for` gives its task
the build's `runtime_env` (pip / image_uri / py_executable, `matrix.builds.runtime_env_for`) and its
engine the build's name and ordinal (`build_env`: the simulated engine keys a hang model's
`when: {build: ...}` on them, in scaled real time as in virtual time). Ray installs or starts the
build; one it cannot (RuntimeEnvSetupError, an interpreter missing on the nodes) comes back as the
cell's config or infra error, which is an `untestable` build here, never a hang.

Each probe has its own engine seed (`--seed` and the probe's number): independent soaks, as the
pooled exposure assumes. The soak job's result becomes a probe result as the flag bisection's soak oracle makes it
(`matrix.bisect.oracle_soak.probe_result`: engine seconds up to the hang), then a build probe's
(`oracle.convert`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.bisect.oracle import Probe
from soakmatrix.matrix.bisect.oracle_soak import new_launcher, probe_result, side_by_side
from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.plan import PlannedCell, planned_cell
from soakmatrix.matrix.soak_specs import matrix_time_scale, soak_spec_for, startup_timeout_s
from soakmatrix.matrix.spec import Matrix, Profile
from soakmatrix.matrix.spec_types import Build

from .oracle import HANG, BuildProbe, BuildProbeResult, convert


class BuildSoakOracle:
    """Soaks each probe's build of `builds` (indexed as the bisection's list) with the failing cell `pc`."""

    def __init__(self, matrix: Matrix, profile: Profile, pc: PlannedCell, builds: Sequence[Build], *,
                 backend: str = "sim", out_dir: str | Path = "bisect-out", hang_model: str | None = None,
                 seed: int | None = None, launcher_factory: Callable[[], Any] | None = None,
                 progress: Callable[[str], None] | None = None):
        self.matrix, self.profile, self.pc = matrix, profile, pc
        self.builds = list(builds)
        self.backend = backend
        self.out_dir = Path(out_dir)
        # the simulated engine reads the hang model from its spec: --hang-model replaces the matrix's
        self.overrides = {"hang_model": str(Path(hang_model).resolve())} if hang_model else {}
        self._launcher_factory = launcher_factory
        self._launcher = None
        self._progress = progress
        self._round = 0
        self._probes = 0
        self._seed = seed or 0

    def cell(self, probe: BuildProbe) -> PlannedCell:
        combo = {"model": self.pc.cell.model, "gpu": self.pc.cell.gpu, "workload": self.pc.cell.workload,
                 **self.pc.cell.flag_dict}
        pc = planned_cell(self.matrix, self.profile, combo, build=self.builds[probe.index])
        return replace(pc, soak_s=probe.soak_s)

    def launcher(self) -> Any:
        if self._launcher is None:
            self._launcher = new_launcher(self._launcher_factory)
        return self._launcher

    def resume_after(self, rounds: int, probes: int) -> None:
        """A resumed bisection (`journal.JournalingOracle`) replayed `rounds` rounds of `probes` probes:
        number the next round's folder and seeds after theirs, not over them."""
        self._round, self._probes = self._round + rounds, self._probes + probes

    def run(self, probes: Sequence[BuildProbe]) -> list[BuildProbeResult]:
        """One round: every probe at once, repeats of one build as copies of its cell (`side_by_side`)."""
        from soakmatrix.matrix.schedule import ClusterLost, cap_seconds, run_cells

        if not probes:
            return []
        cells = side_by_side([self.cell(p) for p in probes])
        self._round += 1
        while (self.out_dir / f"probe-{self._round:03d}").exists():   # a stopped round's: keep what it left
            self._round += 1
        round_dir = self.out_dir / f"probe-{self._round:03d}"
        by_id = {pc.id: i for i, pc in enumerate(cells)}
        for p in probes:
            self._say(f"probe {self._round}: build {p.build} ({self.builds[p.index].kind}), "
                      f"soak up to {format_duration(p.soak_s)}")

        # a seed per probe: the simulated engine draws its hang times from it, and two soaks with one
        # seed would hang at the same moment (pooled, they would count as two independent hangs)
        seeds = {}
        for pc in cells:
            self._probes += 1
            seeds[pc.id] = self._seed * 100_003 + self._probes

        def make_spec(pc: PlannedCell) -> SoakSpec:
            return soak_spec_for(pc, self.matrix, self.backend, round_dir, seed=seeds[pc.id], **self.overrides)

        cap = cap_seconds(max(pc.soak_s for pc in cells), startup_timeout_s(self.profile.startup_s), None,
                          matrix_time_scale(self.matrix, self.backend))
        summary = run_cells(cells, make_spec, self.launcher(), _Silent(),
                            retries=self.profile.retries, cap_s=cap, order=list)
        if summary.interrupted:
            raise KeyboardInterrupt   # Ctrl-C: the loop stopped the probes; the bisection stops too
        if summary.lost:
            raise ClusterLost(summary.lost)   # no answers: the round is not journaled, a resume soaks it again
        out: list[BuildProbeResult | None] = [None] * len(probes)
        for result in summary.results:
            i = by_id.get(result.cell_id)
            if i is None:
                continue
            flag_probe = Probe(flags=dict(cells[i].cell.flag_dict), soak_s=probes[i].soak_s,
                               label=f"build={probes[i].build}")
            out[i] = convert(probes[i], probe_result(flag_probe, result, cells[i].gpu_count, self.profile.startup_s))
            self._say(f"probe {self._round}: build {probes[i].build}: {_said(out[i], result)}")
        return [r if r is not None else convert(probes[i], probe_result(
                    Probe(flags={}, soak_s=probes[i].soak_s), _no_result(cells[i]), cells[i].gpu_count, 0.0))
                for i, r in enumerate(out)]

    def _say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(f"soakmatrix bisect: {message}")


def _said(r: BuildProbeResult, result: CellResult) -> str:
    if r.outcome == HANG:
        return f"{r.signature} after {format_duration(r.exposure_s)} of load"
    if r.outcome == "passed":
        return f"no hang in {format_duration(r.exposure_s)} of load"
    first = (result.message or "").strip().splitlines()
    return f"untestable ({result.outcome.value}): {first[0] if first else 'no message'}"


def _no_result(pc: PlannedCell) -> CellResult:
    from soakmatrix.matrix.contracts.outcomes import Outcome

    return CellResult(cell_id=pc.id, cell_name=pc.name, outcome=Outcome.INFRA_ERROR, message="no result (cancelled)")


class _Silent:
    """The loop's events: this oracle says what it probes itself, one line per probe."""

    def cell_started(self, pc, attempt, node) -> None:
        pass

    def cell_retrying(self, pc, result) -> None:
        pass

    def cell_finished(self, pc, result) -> None:
        pass

    def tick(self) -> None:
        pass
