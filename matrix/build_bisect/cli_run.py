"""`soakmatrix bisect MATRIX --cell ID --builds FILE|GOOD..BAD`: the build bisection of one failing
cell, set up from the matrix as the flag bisection is (the API's `soakmatrix.bisect_builds`, which
the CLI calls, calls `run_for_cell`; it answers a `BuildRun`).

The builds list (`specs.resolve_builds`, or `GOOD..BAD` over the matrix's `builds:`) becomes the
matrix's `Build`s (`matrix_builds.to_builds`: names of the matrix's `builds:` section or build
specs). Probes run either in virtual time from the hang model (`--virtual`, `oracle_hangmodel`), or as soak jobs of the failing cell on each build,
through Ray's runtime_env on the connected (or a local) Ray cluster (`oracle_soak.BuildSoakOracle`).
With `--store`, the history's results of the failing cell on listed builds enter as known evidence
(`history`), in both modes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from soakmatrix.matrix.bisect.journal import ProbeJournal, journaled
from soakmatrix.matrix.bisect.model import default_gpu_count
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.contracts.redact import redact_text
from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec import Matrix, Profile
from soakmatrix.matrix.spec_types import Build

from . import history as hist
from .journal import BUILD_CODEC
from .matrix_builds import UnknownBuild, section_range, to_builds
from .oracle import BUILD_PIECES
from .posterior import BuildEvidence
from .report import render_text, to_json
from .result import BAD_UNTESTABLE, FOUND, NOT_A_REGRESSION, NOT_REPRODUCED, RANGE, RATE_CHANGE
from .run import run_build_bisection
from .specs import BuildSpecError, git_rev_list, resolve_builds

EXIT_OF = {
    FOUND: EXIT_FOUND,
    RANGE: EXIT_FOUND,
    RATE_CHANGE: EXIT_FOUND,
    NOT_A_REGRESSION: EXIT_OK,
    NOT_REPRODUCED: EXIT_OK,
    BAD_UNTESTABLE: EXIT_USAGE,
}


@dataclass(frozen=True)
class BuildRun:
    """A finished build bisection of one cell, as `run_for_cell` answers it."""

    code: int  # the exit code: the flag bisection's when `then` ran
    result: Any  # the BuildBisectResult
    doc: dict  # the JSON document, without the flags' (`flag_doc`)
    text: str  # the report
    flag_doc: dict | None = None  # `then`'s JSON document, when it ran


class BuildUsage(Exception):
    """A builds list that cannot be read, an unknown build, no Ray to reach: exit 2."""


@dataclass(frozen=True)
class RealProbes:
    """Where real probes run: the engine backend, the Ray address (None: RAY_ADDRESS or a local
    cluster) and the folder for the soak jobs' artifacts."""

    backend: str = "sim"
    ray_address: str | None = None
    out_dir: str = "bisect-out"


def run_for_cell(
    matrix: Matrix,
    pc: PlannedCell,
    profile: Profile,
    *,
    builds_arg: str,
    template: str | None,
    checkout: str,
    virtual: bool,
    hang_model_path: str | None,
    seed: int | None,
    confidence: float,
    budget_gpu_hours: float | None,
    max_probes: int,
    calibration_hangs: int,
    signature: str | None,
    as_json: bool,
    out: TextIO | None,
    progress: Callable[[str], None] | None = None,
    real: RealProbes = RealProbes(),
    store_path: str | None = None,
    then: Callable[[Build, str | None, BuildEvidence], tuple[int, dict, str]] | None = None,
    parallel: int = 1,
    max_soak_s: float | None = None,
    journal: Callable[[dict], ProbeJournal | None] | None = None,
    junit: str | None = None,
) -> BuildRun:
    """Bisect the builds for `pc`, print the report to `out` (None: print nothing). `then(first bad build, target signature,
    what was seen on that build)` runs after a found first bad build (the flag bisection on it) and
    answers (exit code, `--json` document, text): its report follows the builds' (nested under `flags`
    in JSON) and its code is returned. `journal(header)` opens the probe journal (None: none is kept):
    the probes are answered from it first and every new answer goes into it. `max_soak_s`: a longer
    probe soaks in pieces of at most that much load (`oracle_chunked`). `junit`: a file for the answer's
    JUnit XML (one test case per signature); one that cannot be written is exit 3 when the answer was 0."""
    if virtual and not hang_model_path:
        raise BuildUsage("--builds --virtual needs a hang model: --hang-model FILE or the matrix's sim.hang_model")
    try:
        specs = None if Path(builds_arg).exists() else section_range(builds_arg, matrix.builds)
        if specs is None:
            specs = resolve_builds(builds_arg, template=template, rev_list=git_rev_list(checkout))
        builds = to_builds(specs, matrix.builds, matrix.file)
    except (BuildSpecError, UnknownBuild) as exc:
        raise BuildUsage(f"--builds: {exc}") from None
    names = [b.name for b in builds]
    evidence = None
    if store_path:
        evidence = _history(store_path, pc, names, signature)
        signature = evidence.signature
    gpus = default_gpu_count(pc.cell.flag_dict)
    say = progress or (lambda _msg: None)
    say(
        f"soakmatrix bisect: cell {pc.id} {pc.name}: {len(builds)} builds, {names[0]} .. {names[-1]}"
        + (" (virtual time)" if virtual else f" (soak jobs, {real.backend})")
        + (f"; target signature {signature}" if signature else "")
    )
    if evidence is not None:
        say(f"soakmatrix bisect: from {store_path}: {_history_line(evidence)}")
    # the journal before Ray: one that cannot be used is exit 2 before a cluster starts
    log = (
        journal(
            {
                "cell": pc.id,
                "builds": names,
                "signature": signature,
                "virtual": virtual,
                "backend": real.backend,
                "seed": seed,
                "confidence": confidence,
                "calibration_hangs": calibration_hangs,
                "parallel": parallel,
                "max_soak_s": max_soak_s,
                "history": evidence.to_json(names) if evidence else None,
            }
        )
        if journal
        else None
    )
    cluster = None
    try:
        if virtual:
            assert hang_model_path is not None, "--virtual without a hang model is refused above"
            oracle = _virtual_oracle(matrix, pc, profile, hang_model_path, builds, gpus, seed)
        else:
            oracle, cluster = _soak_oracle(matrix, pc, profile, builds, real, hang_model_path, seed, progress)
            say(f"soakmatrix bisect: on {redact_text(cluster.description)}")
    except BaseException:
        if log is not None:
            log.close()
        raise
    oracle = journaled(oracle, log, max_soak_s, BUILD_CODEC, BUILD_PIECES)
    try:
        result = run_build_bisection(
            names,
            oracle,
            confidence=confidence,
            budget_gpu_hours=budget_gpu_hours,
            signature=signature,
            startup_s=profile.startup_s,
            gpus=gpus,
            max_probes=max_probes,
            calibration_hangs=calibration_hangs,
            known=evidence.known if evidence else None,
            parallel=parallel,
        )
    finally:
        if cluster is not None:
            cluster.close()
        if log is not None:
            log.close()
    code = EXIT_OF.get(result.status, EXIT_INFRA)
    text = render_text(result, history=_history_line(evidence) if evidence else None)
    if not as_json and out is not None:  # printed before the flag bisection: hours of probes are not lost if it fails
        print(text, file=out, flush=True)
    flag_doc = None
    if then is not None and result.status in (FOUND, RATE_CHANGE) and result.first_bad is not None:
        first_bad = builds[result.first_bad]
        if as_json and progress:
            progress(f"soakmatrix bisect: first bad build {first_bad.name} (last good {names[result.first_bad - 1]})")
        code, flag_doc, flag_text = then(first_bad, result.signature, result.evidence[result.first_bad])
        if not as_json and out is not None:
            print(f"\nthe flags on the first bad build {first_bad.name}:\n{flag_text}", file=out)
    doc = to_json(result, history=evidence.to_json(names) if evidence else None)
    doc.update(
        {
            "matrix": matrix.file,
            "cell": {"id": pc.id, "name": pc.name},
            "oracle": "virtual" if virtual else f"soak ({real.backend})",
        }
    )
    if as_json and out is not None:
        print(
            json.dumps(
                {**doc, **({"flags": flag_doc} if flag_doc is not None else {})}, indent=2, sort_keys=True, default=str
            ),
            file=out,
            flush=True,
        )
    if store_path:
        _record(store_path, pc, doc)
    if junit and not _write_junit(junit, doc):
        code = EXIT_INFRA if code == EXIT_OK else code  # no JUnit is never a pass: CI would go green on nothing
    return BuildRun(code, result, doc, text, flag_doc)


def _write_junit(path: str, doc: dict) -> bool:
    """The answer's JUnit (`reports/junit_builds.py`); False, said on stderr, when it cannot be written."""
    import sys

    from soakmatrix.reports.junit_builds import write_build_bisection_junit

    try:
        write_build_bisection_junit(doc, path)
    except OSError as exc:
        print(f"soakmatrix bisect: JUnit not written to {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def _record(store_path: str, pc: PlannedCell, doc: dict) -> None:
    """The build bisection's report into the store (the dashboard's Bisections), after it was printed:
    a store that fails here loses nothing but the record, and says so."""
    import sqlite3
    import sys

    from soakmatrix.reports.history import HistoryStore, StoreError

    try:
        with HistoryStore(store_path) as store:
            store.record_bisection(pc.id, {**doc, "kind": "builds"})
    except (StoreError, OSError, sqlite3.Error) as exc:
        print(
            f"soakmatrix bisect: --store: could not record the result in {store_path}: {exc}; the result above stands",
            file=sys.stderr,
        )


def _virtual_oracle(
    matrix: Matrix, pc: PlannedCell, profile: Profile, hang_model_path: str, builds: list, gpus: int, seed: int | None
):
    from soakmatrix.matrix.contracts.hangmodel import load_hang_model

    from .oracle_hangmodel import HangModelBuildOracle

    names = [b.name for b in builds]
    # the hang model may name any build of the matrix's section, listed or not, as `run` reads it
    known = [*matrix.builds, *(n for n in names if n not in matrix.builds)]
    model = load_hang_model(hang_model_path, registry=matrix.registry, builds=known)
    return HangModelBuildOracle(
        model,
        pc.cell.flag_dict,
        pc.cell.gpu,
        names,
        startup_s=profile.startup_s,
        gpus=gpus,
        seed=seed,
        registry=matrix.registry,
        ordinals=[b.ordinal for b in builds],
    )


RAY_HINT = "(--ray-address ADDRESS or RAY_ADDRESS, or leave both out for a local cluster; --virtual needs no Ray)"


def _soak_oracle(
    matrix: Matrix,
    pc: PlannedCell,
    profile: Profile,
    builds,
    real: RealProbes,
    hang_model_path: str | None,
    seed: int | None,
    progress: Callable[[str], None] | None,
):
    """Soak jobs on Ray, connected as `soakmatrix run` connects; the caller closes the handle."""
    from soakmatrix.matrix.schedule.cluster import CONNECT_ERRORS, address_from, cannot_reach, connect
    from soakmatrix.matrix.stop_signals import reinstall_active

    from .oracle_soak import BuildSoakOracle

    address = address_from(real.ray_address)
    try:
        cluster = connect(address, backend=real.backend, gpus=matrix.gpus)
    except CONNECT_ERRORS as exc:
        raise BuildUsage(f"{cannot_reach(address, exc)} {RAY_HINT}") from None
    reinstall_active()  # ray.init put its own SIGINT/SIGTERM handlers in: ours stop the probes cleanly
    oracle = BuildSoakOracle(
        matrix,
        profile,
        pc,
        builds,
        backend=real.backend,
        out_dir=real.out_dir,
        hang_model=hang_model_path if real.backend == "sim" else None,
        seed=seed,
        progress=progress,
    )
    return oracle, cluster


def _history(store_path: str, pc: PlannedCell, names: list[str], signature: str | None) -> hist.HistoryEvidence:
    import sqlite3

    from soakmatrix.reports.history import HistoryStore, StoreError

    try:
        with HistoryStore(store_path) as store:
            results = hist.read_results(store)
    except (StoreError, OSError, sqlite3.Error) as exc:
        raise BuildUsage(f"--store: {exc}") from None
    mine = hist.cell_results(results, pc.cell.model, pc.cell.gpu, pc.cell.flag_dict, pc.cell.workload, names)
    return hist.evidence(mine, names, signature or hist.newest_signature(mine), store_path)


def _history_line(e: hist.HistoryEvidence) -> str:
    from soakmatrix.matrix.contracts.durations import format_duration

    if not e.results:
        return "no result of this cell on the listed builds"
    return (
        f"{e.results} result(s) of this cell on {len(e.known)} listed build(s): {e.target_hangs} hang(s) of "
        f"{e.signature or 'the target'}, {e.other_hangs} of other signatures, "
        f"{format_duration(e.exposure_s)} of load"
    )
