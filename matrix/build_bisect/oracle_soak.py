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
pooled exposure assumes. The round itself (folders, seeds, the scheduler, a stop or a lost cluster) is the flag bisection's
(`matrix.bisect.oracle_soak.SoakRounds`), and the soak job's result becomes a probe result as the
flag bisection's soak oracle makes it (`probe_result`: engine seconds up to the hang), then a build
probe's (`oracle.convert`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from soakmatrix.matrix.bisect.oracle import Probe
from soakmatrix.matrix.bisect.oracle_soak import SoakRounds, probe_result, side_by_side
from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.plan import PlannedCell, planned_cell
from soakmatrix.matrix.spec import Matrix, Profile
from soakmatrix.matrix.spec_types import Build

from .oracle import HANG, BuildProbe, BuildProbeResult, convert


class BuildSoakOracle(SoakRounds):
    """Soaks each probe's build of `builds` (indexed as the bisection's list) with the failing cell `pc`."""

    def __init__(
        self,
        matrix: Matrix,
        profile: Profile,
        pc: PlannedCell,
        builds: Sequence[Build],
        *,
        backend: str = "sim",
        out_dir: str | Path = "bisect-out",
        hang_model: str | None = None,
        seed: int | None = None,
        launcher_factory: Callable[[], Any] | None = None,
        progress: Callable[[str], None] | None = None,
    ):
        # the simulated engine reads the hang model from its spec: --hang-model replaces the matrix's
        super().__init__(
            matrix,
            profile,
            backend=backend,
            out_dir=out_dir,
            launcher_factory=launcher_factory,
            seed=seed,
            overrides={"hang_model": str(Path(hang_model).resolve())} if hang_model else {},
        )
        self.pc = pc
        self.builds = list(builds)
        self._progress = progress

    def cell(self, probe: BuildProbe) -> PlannedCell:
        combo = {
            "model": self.pc.cell.model,
            "gpu": self.pc.cell.gpu,
            "workload": self.pc.cell.workload,
            **self.pc.cell.flag_dict,
        }
        pc = planned_cell(self.matrix, self.profile, combo, build=self.builds[probe.index])
        return replace(pc, soak_s=probe.soak_s)

    def run(self, probes: Sequence[BuildProbe]) -> list[BuildProbeResult]:
        """One round: every probe at once, repeats of one build as copies of its cell (`side_by_side`)."""
        if not probes:
            return []
        cells = side_by_side([self.cell(p) for p in probes])
        round_dir = self.next_round()
        for p in probes:
            self._say(
                f"probe {self._round}: build {p.build} ({self.builds[p.index].kind}), "
                f"soak up to {format_duration(p.soak_s)}"
            )
        out: list[BuildProbeResult] = []
        for i, result in enumerate(self.soak(cells, round_dir)):
            if result is None:
                out.append(
                    convert(
                        probes[i],
                        probe_result(
                            Probe(flags={}, soak_s=probes[i].soak_s), _no_result(cells[i]), cells[i].gpu_count, 0.0
                        ),
                    )
                )
                continue
            flag_probe = Probe(
                flags=dict(cells[i].cell.flag_dict), soak_s=probes[i].soak_s, label=f"build={probes[i].build}"
            )
            out.append(convert(probes[i], probe_result(flag_probe, result, cells[i].gpu_count, self.profile.startup_s)))
            self._say(f"probe {self._round}: build {probes[i].build}: {_said(out[-1], result)}")
        return out

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
