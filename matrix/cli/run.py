"""`soakmatrix run`: soak every cell of a matrix profile on Ray and write the results as they come
(the API's `soakmatrix.plan` and `soakmatrix.run` do the planning, running and recording)."""

from __future__ import annotations

import argparse
import sys

from soakmatrix.api.matrices import load_matrix, plan
from soakmatrix.api.running import run
from soakmatrix.matrix.paths import empty_store_warning
from soakmatrix.matrix.run import add_run_options, say_rejected
from soakmatrix.matrix.run_types import RunOptions

HELP = (
    "Run a matrix profile on Ray: one task per cell on a node with the right GPU type and count; "
    "a local cluster with simulated GPUs unless --ray-address or RAY_ADDRESS names one."
)
OUTLIVES_ITS_READER = True  # hours of work whose results are in files: a closed stderr does not end it


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser)


def main(args: argparse.Namespace) -> int:
    warning = empty_store_warning("--store", args.store)
    if warning:
        print(f"soakmatrix run: {warning}", file=sys.stderr)
    matrix = load_matrix(args.matrix)
    profile = matrix.profile(args.profile)
    planned = plan(matrix, profile.name, backend=args.backend, on_rejected=say_rejected)
    return run(matrix, profile=profile.name, cells=planned.cells, options=RunOptions.from_args(args)).exit_code
