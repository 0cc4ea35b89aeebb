"""Running a matrix: `run(matrix, ...)` soaks a profile's cells on Ray (a local cluster with
simulated GPUs, or the one at `ray_address`) and answers a `RunResult`.

Every result goes to the history store as it comes, JUnit and the dashboard are rewritten along the
way and at the end; `progress(event)` hears each cell start, retry and result (a `CellEvent`). The
progress lines `soakmatrix run` prints go to `log` (default: stderr).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.run_types import RunOptions, RunResult
from soakmatrix.matrix.spec_types import Matrix

from .matrices import as_matrix, plan
from .types import CellEvent

ProgressFn = Callable[[CellEvent], None]


class _Callback:
    """schedule.Events as calls of one progress function with a CellEvent."""

    def __init__(self, progress: ProgressFn):
        self.progress = progress

    def cell_started(self, pc: PlannedCell, attempt: int, node: str) -> None:
        self.progress(CellEvent("started", pc, attempt=attempt, node=node))

    def cell_retrying(self, pc: PlannedCell, result) -> None:
        self.progress(CellEvent("retrying", pc, result, attempt=result.attempt))

    def cell_finished(self, pc: PlannedCell, result) -> None:
        self.progress(CellEvent("finished", pc, result, attempt=result.attempt, node=result.node))

    def tick(self) -> None:
        pass


def run(
    matrix: Matrix | str | Path,
    *,
    profile: str | None = None,
    cells: Sequence[PlannedCell] | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
    out: str | Path | None = None,
    store: str | Path | None = None,
    resume: bool | None = None,
    options: RunOptions | None = None,
    progress: ProgressFn | None = None,
    fail_fast: bool = False,
    keep_order: bool = False,
    kind: str = "run",
    log: TextIO | None = None,
) -> RunResult:
    """Soak `cells` (default: every cell of `profile`'s plan) and record each result.

    `options` holds backend, ray_address, out, store and resume; a keyword given here overrides it.
    `fail_fast` cancels the rest at the first hang or crash; `keep_order` runs the cells in the order
    given (else largest first); `kind` names the run in the store ("run", "smoke"). Raises SpecError
    for a store that is not one; a cluster that cannot be reached is `RunResult.unreachable`."""
    from soakmatrix.matrix.run import run_planned

    m = as_matrix(matrix)
    chosen = m.profile(profile)
    # the keywords given, each of RunOptions' own type
    given: dict[str, Any] = {
        k: v
        for k, v in {
            "backend": backend,
            "ray_address": ray_address,
            "resume": resume,
            "out": None if out is None else str(out),
            "store": None if store is None else str(store),
        }.items()
        if v is not None
    }
    opts = replace(options or RunOptions(), **given)
    if cells is None:
        cells = plan(m, chosen.name, backend=opts.backend).cells
    listener = _Callback(progress) if progress is not None else None
    return run_planned(
        m,
        chosen,
        list(cells),
        opts,
        kind=kind,
        fail_fast=fail_fast,
        keep_order=keep_order,
        stream=log,
        listener=listener,
    )
