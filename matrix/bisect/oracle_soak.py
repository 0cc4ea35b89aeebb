"""The real probe oracle: each probe is a soak job (`jobs.soak.run_cell`) scheduled on Ray.

Probes become planned cells of the failing cell's model, GPU type and workload with the probe's
flags and soak length, and go through the same scheduler as `soakmatrix run`
(`matrix.schedule.run_cells` with a `RayLauncher`: `num_gpus = TP`, the GPU type's accelerator
label, infra errors retried elsewhere). With the simulated engine every duration is engine time
(`--time-scale` divides wall time), so answers match the virtual oracle's on the same hang model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.plan import PlannedCell, planned_cell
from soakmatrix.matrix.soak_specs import matrix_time_scale, soak_spec_for, startup_timeout_s
from soakmatrix.matrix.spec import Matrix, Profile
from soakmatrix.matrix.spec_types import Build

from .oracle import Probe, ProbeResult


@dataclass(frozen=True)
class ProbeCopy(PlannedCell):
    """A second (third, ...) probe of one cell in one round: the same cell under its own id and name,
    so the scheduler, which keys running cells by id, soaks it beside the first instead of after it,
    and its artifacts get their own folder."""

    copy: int = 1

    @property
    def id(self) -> str:
        return f"{self.cell.id}.{self.copy}"

    @property
    def name(self) -> str:
        return f"{self.cell.name} (copy {self.copy + 1})"


def side_by_side(cells: Sequence[PlannedCell]) -> list[PlannedCell]:
    """`cells` with each repeat of a cell made a `ProbeCopy` of it: one round soaks them all at once
    (the calibration's copies of the bad build, the end game's refuting pass split over copies)."""
    seen: dict[str, int] = {}
    out: list[PlannedCell] = []
    for pc in cells:
        k = seen[pc.id] = seen.get(pc.id, -1) + 1
        out.append(pc if k == 0 else ProbeCopy(**{f.name: getattr(pc, f.name) for f in fields(pc)}, copy=k))
    return out


def new_launcher(factory: Callable[[], Any] | None) -> Any:
    """The scheduler's launcher: the factory's (tests pass a fake), else Ray's."""
    if factory is not None:
        return factory()
    from soakmatrix.matrix.schedule import RayLauncher

    return RayLauncher()


def probe_result(probe: Probe, result: CellResult, gpu_count: int, startup_s: float) -> ProbeResult:
    """A soak job's CellResult as a probe result: exposure in engine seconds, up to the hang."""
    outcome = result.outcome.value
    exposure = result.exposure_s
    if outcome in ("hang", "crash") and result.time_to_hang_s is not None:
        exposure = min(exposure, result.time_to_hang_s) if exposure else result.time_to_hang_s
    gpu_hours = gpu_count * (startup_s + exposure) / 3600.0
    return ProbeResult(
        probe,
        outcome,
        result.signature if outcome in ("hang", "crash") else None,
        exposure,
        gpu_hours,
        result.message,
        {"cell_id": result.cell_id, "artifacts": dict(result.artifacts), "node": result.node},
    )


class SoakRounds:
    """One round of planned cells soaked side by side as soak jobs on Ray: what the flag and the build
    bisections' soak oracles share (this module's `SoakOracle`, `build_bisect.oracle_soak`). Each
    round gets its own folder (`probe-NNN`, after any a stopped round left) and each soak its own
    engine seed; a stopped loop (Ctrl-C, SIGTERM) raises KeyboardInterrupt, a lost cluster
    ClusterLost: no answers, so the round is not journaled and a resume soaks it again."""

    def __init__(
        self,
        matrix: Matrix,
        profile: Profile,
        *,
        backend: str = "sim",
        out_dir: str | Path = "bisect-out",
        launcher_factory: Callable[[], Any] | None = None,
        seed: int | None = None,
        on_result: Callable[[CellResult], None] | None = None,
        overrides: dict[str, Any] | None = None,
    ):
        self.matrix, self.profile = matrix, profile
        self.backend = backend
        self.out_dir = Path(out_dir)
        self.overrides = dict(overrides or {})  # more keyword arguments of `soak_spec_for`
        self._launcher_factory = launcher_factory
        self._launcher = None
        self._on_result = on_result
        self._round = 0
        self._seed = seed or 0
        self._probes = 0

    def launcher(self) -> Any:
        if self._launcher is None:
            self._launcher = new_launcher(self._launcher_factory)
        return self._launcher

    def resume_after(self, rounds: int, probes: int) -> None:
        """A resumed bisection (`journal.JournalingOracle`) replayed `rounds` rounds of `probes` probes:
        number the next round's folder and seeds after theirs, not over them."""
        self._round, self._probes = self._round + rounds, self._probes + probes

    def next_round(self) -> Path:
        """The next round's folder (a stopped round's is kept, with what it left)."""
        self._round += 1
        while (self.out_dir / f"probe-{self._round:03d}").exists():
            self._round += 1
        return self.out_dir / f"probe-{self._round:03d}"

    def soak(self, cells: Sequence[PlannedCell], round_dir: Path) -> list[CellResult | None]:
        """Soak `cells` (made distinct by `side_by_side`) at once in `round_dir`: each one's result,
        None where the loop gave none."""
        from soakmatrix.matrix.schedule import ClusterLost, cap_seconds, run_cells

        by_id = {pc.id: i for i, pc in enumerate(cells)}
        # a seed per probe: the simulated engine draws its hang times from it, and two soaks of one
        # config with one seed would hang at the same moment (pooled, counted as two independent hangs)
        seeds = {}
        for pc in cells:
            self._probes += 1
            seeds[pc.id] = self._seed * 100_003 + self._probes

        def make_spec(pc: PlannedCell) -> SoakSpec:
            return soak_spec_for(pc, self.matrix, self.backend, round_dir, seed=seeds[pc.id], **self.overrides)

        cap = cap_seconds(
            max(pc.soak_s for pc in cells),
            startup_timeout_s(self.profile.startup_s),
            None,
            matrix_time_scale(self.matrix, self.backend),
        )
        summary = run_cells(
            cells,
            make_spec,
            self.launcher(),
            _Quiet(self._on_result),
            retries=self.profile.retries,
            cap_s=cap,
            order=list,
        )
        if summary.interrupted:
            # Ctrl-C or SIGTERM: the loop stopped the probes; cancelled probes are no answers (the
            # bisection would read them as infrastructure errors and go on soaking)
            raise KeyboardInterrupt
        if summary.lost:
            raise ClusterLost(summary.lost)  # no answers: the round is not journaled, a resume soaks it again
        out: list[CellResult | None] = [None] * len(cells)
        for result in summary.results:
            i = by_id.get(result.cell_id)
            if i is not None:
                out[i] = result
        return out


class SoakOracle(SoakRounds):
    """Runs each batch of probes as soak jobs side by side on the connected Ray cluster."""

    def __init__(
        self,
        matrix: Matrix,
        profile: Profile,
        model: str,
        gpu: str,
        workload: str,
        *,
        backend: str = "sim",
        out_dir: str | Path = "bisect-out",
        launcher_factory: Callable[[], Any] | None = None,
        on_result: Callable[[CellResult], None] | None = None,
        seed: int | None = None,
        build: Build | None = None,
    ):
        super().__init__(
            matrix,
            profile,
            backend=backend,
            out_dir=out_dir,
            launcher_factory=launcher_factory,
            seed=seed,
            on_result=on_result,
        )
        self.model, self.gpu, self.workload = model, gpu, workload
        self.build = build  # the engine build every probe runs in (its runtime_env); None: the nodes'

    def _cell(self, probe: Probe) -> PlannedCell:
        combo = {"model": self.model, "gpu": self.gpu, "workload": self.workload, **probe.flags}
        return replace(planned_cell(self.matrix, self.profile, combo, build=self.build), soak_s=probe.soak_s)

    def run(self, probes: Sequence[Probe]) -> list[ProbeResult]:
        """One round: every probe at once, repeats of one config as copies of it (`side_by_side`)."""
        if not probes:
            return []
        cells = side_by_side([self._cell(p) for p in probes])
        results = self.soak(cells, self.next_round())
        return [
            probe_result(probes[i], r, cells[i].gpu_count, self.profile.startup_s)
            if r is not None
            else ProbeResult(probes[i], "infra_error", None, 0.0, 0.0, "no result (cancelled)")
            for i, r in enumerate(results)
        ]


class _Quiet:
    """The loop's events: only each finished cell's result, to `on_result` when given."""

    def __init__(self, on_result: Callable[[CellResult], None] | None):
        self._on_result = on_result

    def cell_started(self, pc, attempt, node) -> None:
        pass

    def cell_retrying(self, pc, result) -> None:
        pass

    def cell_finished(self, pc, result) -> None:
        if self._on_result is not None:
            self._on_result(result)

    def tick(self) -> None:
        pass
