"""Flag bisection: `bisect_flags(matrix, cell, ...)`, the smallest set of flags (relative to the
matrix baseline) that still hangs like the failing cell, with stated confidence.

The bisection is set up from the matrix (`matrix.bisect.setup`: the cell's elements and context, the
oracle: virtual time from a hang model, or soak jobs on Ray) and run by `matrix.bisect.bisect`; each
answered probe goes to the journal in `out`. With a store, the cell's recorded hangs give the
signature and free exposure, and the answer is recorded there. Answers a `FlagBisection`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec_types import Matrix, Profile

from .errors import UsageError
from .matrices import as_matrix, find_cell, plan
from .types import BisectOptions, FlagBisection

Say = Callable[[str], None]


def bisect_flags(
    matrix: Matrix | str | Path,
    cell: str | PlannedCell,
    *,
    profile: str | None = None,
    options: BisectOptions | None = None,
    progress: Say | None = None,
    warn: Say | None = None,
    on_result: Callable[[FlagBisection], None] | None = None,
    **overrides: Any,
) -> FlagBisection:
    """Bisect the flags of the failing `cell` (its id or name in `profile`'s plan).

    `options` (a BisectOptions; any of its fields may also be given as a keyword) says how;
    `progress(line)` hears each step, `warn(line)` what is worth a warning (default: the warnings
    module). `on_result(answer)` runs as soon as the answer is known, before the regression test
    (`emit_test`) is written and the store records it. Raises UsageError for what cannot run."""
    opts = (options or BisectOptions()).replaced(overrides)
    m = as_matrix(matrix)
    planned = plan(m, profile)
    pc = find_cell(planned, cell)
    setup = prepare(m, pc, opts, warn)
    answer = flag_run(
        m, planned.profile, pc, opts, setup.signature, setup.source, setup.history, setup.hang_model, progress
    )
    return finish(answer, m, opts, setup.hang_model, progress, on_result)


class Setup:
    """What a bisection of one cell starts from: the hang model, the target signature and where it came
    from, and the store's free exposure of the cell."""

    def __init__(self, hang_model: str | None, signature: str | None, source: str, history: Any):
        self.hang_model, self.signature, self.source, self.history = hang_model, signature, source, history


def prepare(matrix: Matrix, pc: PlannedCell, opts: BisectOptions, warn: Say | None) -> Setup:
    """The hang model, the signature (--signature, else the store's newest hang of the cell, else the
    hang model's) and the store's exposure; usage errors before anything runs."""
    from soakmatrix.matrix.bisect.setup import model_signature, recorded_exposure, recorded_signature
    from soakmatrix.matrix.paths import empty_store_warning

    say = warn or _warn
    hang_model = opts.hang_model or matrix.sim.hang_model
    if opts.virtual and not hang_model:
        raise UsageError("--virtual needs a hang model: --hang-model FILE or the matrix's sim.hang_model")
    signature, source = (opts.signature, "--signature") if opts.signature else (None, "")
    history = None
    if opts.store:
        warning = empty_store_warning("--store", opts.store)
        if warning:
            say(warning)
        with open_store(opts.store) as store:
            if signature is None:
                signature, source = recorded_signature(store, pc.id)
            if signature is None and opts.virtual and hang_model:  # --virtual has one (checked above)
                signature, source = model_signature(matrix, pc, hang_model)
            # the nightly's results of this very cell: free exposure for the calibration
            history = recorded_exposure(store, pc.id, signature)
    if signature is None and opts.virtual and hang_model:  # --virtual has one (checked above)
        signature, source = model_signature(matrix, pc, hang_model)
    if opts.signature:
        _check_signature(opts.signature, opts.virtual, hang_model, matrix, say)
    return Setup(hang_model, signature, source, history)


def open_store(path: str):
    """The history store, opened (and so checked) before hours of probes: a file that is not one is a UsageError."""
    import sqlite3

    from soakmatrix.reports.history import HistoryStore, StoreError

    try:
        return HistoryStore(path)
    except (StoreError, OSError, sqlite3.Error) as exc:
        raise UsageError(f"--store: {exc}") from None


def _warn(line: str) -> None:
    import warnings

    warnings.warn(line, stacklevel=3)


def _check_signature(signature: str, virtual: bool, hang_model: str | None, matrix: Matrix, warn: Say) -> None:
    """A signature the virtual oracle can never answer is refused (the bisection would only run out of
    probes); one no detector knows is a warning (a real engine may still show it)."""
    from soakmatrix.jobs.signatures import SIGNATURES
    from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_hang_model

    if virtual and hang_model:
        model = load_hang_model(hang_model, registry=matrix.registry)
        planted = sorted({STYLE_SIGNATURE[h.style] for h in model.hangs})
        if signature not in planted:
            raise UsageError(
                f"--signature {signature!r}: the hang model {hang_model} plants no hang with it "
                f"(it has: {', '.join(planted) or 'none'})"
            )
    elif signature not in SIGNATURES and signature not in STYLE_SIGNATURE.values():
        warn(
            f"warning: --signature {signature!r} is no signature the detectors name "
            f"(they know: {', '.join(sorted(SIGNATURES))}); probes will end only on it"
        )


def max_soak_s(opts: BisectOptions) -> float | None:
    """The longest piece of load one probe soaks in: 12 h with real probes, none in virtual time
    (whose GPU-hours are then the benchmark's)."""
    from soakmatrix.matrix.bisect.policy import DEFAULT_POLICY

    if opts.max_soak_s is not None:
        return opts.max_soak_s
    return None if opts.virtual else DEFAULT_POLICY.max_soak_s


def open_journal(opts: BisectOptions, kind: str, header: dict, progress: Say | None):
    """The probe journal of this bisection in `out` (None: virtual without `out` keeps none)."""
    from soakmatrix.matrix.bisect.journal import ProbeJournal

    folder = opts.journal_dir
    if folder is None:
        if opts.resume:
            raise UsageError("--resume: with --virtual, give the --out the journal was written to")
        return None
    try:
        journal = ProbeJournal(folder / f"journal-{kind}.jsonl", {"kind": kind, **header}, resume=opts.resume)
    except OSError as exc:
        raise UsageError(f"--out: cannot write the probe journal: {exc}") from None
    if progress and opts.resume:
        progress(
            f"soakmatrix bisect: resuming from {journal.path}: {journal.probes} answered probe(s) replayed"
            if journal.batches
            else f"soakmatrix bisect: --resume: no answered probe in {journal.path}; starting afresh"
        )
    return journal


def flag_run(
    matrix: Matrix,
    profile: Profile,
    pc: PlannedCell,
    opts: BisectOptions,
    signature: str | None,
    source: str,
    history: Any,
    hang_model: str | None,
    progress: Say | None,
) -> FlagBisection:
    """The flag bisection of `pc` once set up: its answer, nothing recorded yet."""
    from soakmatrix.matrix.bisect import Settings, bisect_flags
    from soakmatrix.matrix.bisect.history_exposure import calibration_saved, failing_hangs_wanted
    from soakmatrix.matrix.bisect.history_exposure import to_json as history_json
    from soakmatrix.matrix.bisect.journal import journaled
    from soakmatrix.matrix.bisect.oracle_lazy import SoakOnFirstProbe
    from soakmatrix.matrix.bisect.report import render_text, to_json
    from soakmatrix.matrix.bisect.setup import alternatives_of, elements_of, feasibility, soak_oracle, virtual_oracle
    from soakmatrix.matrix.build_bisect.cli_run import RAY_HINT
    from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_INFRA, EXIT_OK
    from soakmatrix.matrix.contracts.redact import redact_text
    from soakmatrix.matrix.schedule.cluster import CONNECT_ERRORS, address_from, cannot_reach

    # only the flag bisection moves flags: a build bisection keeps the cell's flags as they are
    movable, fixed, why = elements_of(pc, matrix)
    settings = Settings(
        confidence=opts.confidence,
        mttf_cap_s=opts.mttf_cap_s,
        startup_s=profile.startup_s,
        calibration_hangs=opts.calibration_hangs,
        parallel=opts.parallel or (1 if opts.virtual else 2),
        max_probes=opts.max_probes,
        budget_gpu_hours=opts.budget_gpu_hours,
        shrink_values=opts.shrink,
        modifier_prior=Settings.modifier_prior if opts.modifier_prior is None else opts.modifier_prior,
        measure_modifiers=opts.measure_modifiers,
    )
    if len(movable) > settings.policy.max_elements:
        raise UsageError(f"{len(movable)} flags differ from the baseline; at most {settings.policy.max_elements}")
    # the journal before Ray: one that cannot be used is a usage error before a cluster starts
    steering = {k: v for k, v in asdict(settings).items() if k not in ("max_probes", "budget_gpu_hours", "policy")}
    journal = open_journal(
        opts,
        "flags",
        {
            "cell": pc.id,
            "build": pc.build.name if pc.build else None,
            "signature": signature,
            "virtual": opts.virtual,
            "backend": opts.backend,
            "seed": opts.seed,
            **steering,
            "max_soak_s": max_soak_s(opts),
            "history": [history.signature, history.hangs, history.exposure_s] if history else None,
        },
        progress,
    )
    if opts.virtual:
        assert hang_model is not None, "--virtual without a hang model is refused in the setup"
        oracle: Any = virtual_oracle(matrix, pc, profile, hang_model, opts.seed)
    else:

        def start() -> tuple[Any, Any]:
            try:
                started = soak_oracle(
                    matrix,
                    pc,
                    profile,
                    backend=opts.backend,
                    ray_address=opts.ray_address,
                    out_dir=str(opts.journal_dir),
                    seed=opts.seed,
                )
            except CONNECT_ERRORS as exc:
                raise UsageError(f"{cannot_reach(address_from(opts.ray_address), exc)} {RAY_HINT}") from None
            if progress:
                progress(f"soakmatrix bisect: on {redact_text(started[1].description)}")
            return started

        oracle = SoakOnFirstProbe(start)
        if journal is None or not journal.batches:
            try:
                oracle.started()
            except BaseException:
                if journal is not None:
                    journal.close()
                raise
    cluster = oracle if isinstance(oracle, SoakOnFirstProbe) else None
    oracle = journaled(oracle, journal, max_soak_s(opts))
    if progress:
        progress(
            f"soakmatrix bisect: cell {pc.id} {pc.name}: {len(movable)} flag(s) differ from the baseline "
            f"({', '.join(e.name for e in movable) or 'none'})"
            + (f"; context: {', '.join(why)}" if why else "")
            + (f"; target signature {signature} (from {source})" if signature else "")
        )
    try:
        result = bisect_flags(
            pc.cell.flag_dict,
            movable,
            oracle,
            settings,
            signature=signature,
            context=why,
            context_elements=fixed,
            alternatives=alternatives_of(movable, matrix),
            feasible=feasibility(pc, matrix),
            progress=progress,
            signature_source=source,
            history=history,
        )
    finally:
        if cluster is not None:
            cluster.close()
        if journal is not None:
            journal.close()
    doc = to_json(result)
    doc.update(
        {
            "matrix": matrix.file,
            "cell": {"id": pc.id, "name": pc.name},
            "oracle": "virtual" if opts.virtual else f"soak ({opts.backend})",
        }
    )
    if history is not None:
        doc["history"] = history_json(
            history, calibration_saved(history, failing_hangs_wanted(settings), pc.gpu_count, settings.startup_s)
        )
    code = {"found": EXIT_FOUND, "not_reproduced": EXIT_OK}.get(result.status, EXIT_INFRA)
    return FlagBisection(result.status, code, pc, result, doc, f"cell {pc.id}  {pc.name}\n" + render_text(result))


def finish(
    answer: FlagBisection,
    matrix: Matrix,
    opts: BisectOptions,
    hang_model: str | None,
    progress: Say | None,
    on_result: Callable[[FlagBisection], None] | None,
) -> FlagBisection:
    """What comes after a flag bisection's answer: `on_result`, the regression test (`emit_test`), the
    store (`store`). What fails here is a warning of the answer, never a lost answer."""
    import sqlite3
    from dataclasses import replace

    if on_result is not None:
        on_result(answer)
    warnings: list[str] = []
    if opts.emit_test:
        from soakmatrix.matrix.bisect.emit import write_regression_test

        if answer.status != "found":
            warnings.append("no minimal set, so no regression test written")
        else:
            try:
                path = write_regression_test(
                    opts.emit_test, answer.result, answer.cell, matrix, opts.backend, hang_model
                )
            except OSError as exc:
                warnings.append(f"--emit-test: could not write {opts.emit_test}: {exc}; the result above stands")
            else:
                if progress:
                    progress(f"soakmatrix bisect: wrote {path}")
    if opts.store:
        from soakmatrix.reports.history import HistoryStore, StoreError

        try:
            with HistoryStore(opts.store) as store:
                store.record_bisection(answer.cell.id, dict(answer.doc))
        except (StoreError, OSError, sqlite3.Error) as exc:
            warnings.append(f"--store: could not record the result in {opts.store}: {exc}; the result above stands")
    return replace(answer, warnings=tuple(warnings))
