"""Build bisection: `bisect_builds(matrix, cell, builds, ...)`, which build of an ordered list brought
the failing cell's hang in; with `then_flags`, the flag bisection of the cell on that first bad build.

`builds` is a builds file (`NAME: SPEC` lines, oldest first), GOOD..BAD naming two builds of the
matrix's `builds:` section, or GOOD..BAD commits of `checkout` turned into specs by `build_template`.
Probes run in virtual time from the hang model or as soak jobs through Ray's runtime_env
(`matrix.build_bisect.cli_run.run_for_cell` sets them up). Answers a `BuildBisection`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec_types import Matrix

from .errors import UsageError
from .flags import Say, finish, flag_run, max_soak_s, open_journal, prepare
from .matrices import as_matrix, find_cell, plan
from .types import DEFAULT_BISECT_OUT, BisectOptions, BuildBisection, FlagBisection


def bisect_builds(
    matrix: Matrix | str | Path,
    cell: str | PlannedCell,
    builds: str | Path,
    *,
    profile: str | None = None,
    then_flags: bool = False,
    options: BisectOptions | None = None,
    progress: Say | None = None,
    warn: Say | None = None,
    report: TextIO | None = None,
    as_json: bool = False,
    **overrides: Any,
) -> BuildBisection:
    """Bisect `builds` for the failing `cell` (its id or name in `profile`'s plan).

    `options` (a BisectOptions, or its fields as keywords) says how, as for `bisect_flags`;
    `parallel` defaults to 1 here. `report`: a stream the report is printed to as soon as it is known
    (the text, or with `as_json` one JSON document at the end); None prints nothing. Raises
    UsageError for a builds list that cannot be read, an unknown build, or no Ray to reach."""
    from soakmatrix.matrix.bisect.history_exposure import HistoryExposure
    from soakmatrix.matrix.build_bisect.cli_run import BuildUsage, RealProbes, run_for_cell
    from soakmatrix.matrix.build_bisect.posterior import BuildEvidence
    from soakmatrix.matrix.plan import planned_cell
    from soakmatrix.matrix.spec_types import Build

    opts = (options or BisectOptions()).replaced(overrides)
    m = as_matrix(matrix)
    planned = plan(m, profile)
    pc = find_cell(planned, cell)
    setup = prepare(m, pc, opts, warn)
    flag_answers: list[FlagBisection] = []

    def then(build: Build, target: str | None, seen: BuildEvidence) -> tuple[int, dict, str]:
        # the failing cell's flags, model, GPU and workload on the first bad build; what the build
        # bisection saw there (the store's results on that build included) is its free exposure
        combo = {"model": pc.cell.model, "gpu": pc.cell.gpu, "workload": pc.cell.workload, **pc.cell.flag_dict}
        bad = planned_cell(m, planned.profile, combo, build=build)
        history = None
        if target is not None and seen.exposure_s > 0:
            history = HistoryExposure(
                target,
                seen.hangs,
                seen.exposure_s,
                seen.probes - seen.untestable,
                (),
                source=f"the build bisection on {build.name}",
            )
        if progress:
            progress(f"soakmatrix bisect: the flags of the cell on the first bad build {build.name}")
        answer = flag_run(
            m,
            planned.profile,
            bad,
            opts,
            target,
            "the build bisection" if target else "",
            history,
            setup.hang_model,
            progress,
        )
        flag_answers.append(answer)
        return answer.exit_code, dict(answer.doc), answer.text

    try:
        done = run_for_cell(
            m,
            pc,
            planned.profile,
            builds_arg=str(builds),
            template=opts.build_template,
            checkout=opts.checkout,
            virtual=opts.virtual,
            hang_model_path=setup.hang_model,
            seed=opts.seed,
            confidence=opts.confidence,
            budget_gpu_hours=opts.budget_gpu_hours,
            max_probes=opts.max_probes,
            calibration_hangs=opts.calibration_hangs,
            signature=setup.signature,
            as_json=as_json,
            out=report,
            progress=progress,
            real=RealProbes(opts.backend, opts.ray_address, str(opts.journal_dir or DEFAULT_BISECT_OUT)),
            store_path=opts.store,
            then=then if then_flags else None,
            parallel=opts.parallel or 1,
            max_soak_s=max_soak_s(opts),
            junit=opts.junit,
            journal=lambda header: open_journal(opts, "builds", header, progress),
        )
    except BuildUsage as exc:
        raise UsageError(str(exc)) from None
    flags = finish(flag_answers[0], m, opts, setup.hang_model, progress, None) if flag_answers else None
    return BuildBisection(done.result.status, done.code, pc, done.result, done.doc, done.text, flags)
