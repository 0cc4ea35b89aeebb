"""`soakmatrix bisect MATRIX --cell ID --builds FILE|GOOD..BAD`: the build bisection of one failing
cell, set up from the matrix as the flag bisection is (`matrix/cli/bisect.py` calls `run_for_cell`).

Probes run in virtual time from the matrix's hang model (`--virtual`); soaking real builds through
Ray's runtime_env per probe is not wired yet, and asking for it is a usage error that says so.
"""

from __future__ import annotations

import json
from typing import Callable, TextIO

from soakmatrix.matrix.bisect.model import default_gpu_count
from soakmatrix.matrix.contracts.hangmodel import load_hang_model
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec import Matrix, Profile

from .algorithm import BAD_UNTESTABLE, FOUND, NOT_A_REGRESSION, NOT_REPRODUCED, RANGE
from .oracle_hangmodel import HangModelBuildOracle
from .report import render_text, to_json
from .run import run_build_bisection
from .specs import BuildSpecError, git_rev_list, resolve_builds

EXIT_OF = {FOUND: EXIT_FOUND, RANGE: EXIT_FOUND, NOT_A_REGRESSION: EXIT_OK, NOT_REPRODUCED: EXIT_OK,
           BAD_UNTESTABLE: EXIT_USAGE}


class BuildUsage(Exception):
    """A builds list that cannot be read, or a mode that is not there yet: exit 2."""


def run_for_cell(matrix: Matrix, pc: PlannedCell, profile: Profile, *, builds_arg: str, template: str | None,
                 checkout: str, virtual: bool, hang_model_path: str | None, seed: int | None, confidence: float,
                 budget_gpu_hours: float | None, max_probes: int, calibration_hangs: int, signature: str | None,
                 as_json: bool, out: TextIO, progress: Callable[[str], None] | None = None) -> int:
    if not virtual:
        raise BuildUsage("--builds runs in virtual time only for now (add --virtual): probes of real builds "
                         "through Ray's runtime_env are not wired yet")
    if not hang_model_path:
        raise BuildUsage("--builds --virtual needs a hang model: --hang-model FILE or the matrix's sim.hang_model")
    try:
        builds = resolve_builds(builds_arg, template=template, rev_list=git_rev_list(checkout))
    except BuildSpecError as exc:
        raise BuildUsage(f"--builds: {exc}") from None
    names = [b.name for b in builds]
    model = load_hang_model(hang_model_path, registry=matrix.registry, builds=names)
    gpus = default_gpu_count(pc.cell.flag_dict)
    oracle = HangModelBuildOracle(model, pc.cell.flag_dict, pc.cell.gpu, names, startup_s=profile.startup_s,
                                  gpus=gpus, seed=seed, registry=matrix.registry)
    if progress:
        progress(f"soakmatrix bisect: cell {pc.id} {pc.name}: {len(builds)} builds, {names[0]} .. {names[-1]} "
                 "(virtual time)")
    result = run_build_bisection(builds, oracle, confidence=confidence, budget_gpu_hours=budget_gpu_hours,
                                 signature=signature, startup_s=profile.startup_s, gpus=gpus, max_probes=max_probes,
                                 calibration_hangs=calibration_hangs)
    print(json.dumps(to_json(result), indent=2, sort_keys=True) if as_json else render_text(result), file=out)
    return EXIT_OF.get(result.status, EXIT_INFRA)
