"""`soakmatrix run`: soak every cell of a matrix profile on Ray and write the results as they come
(`matrix/run.py` does the running and recording)."""

from __future__ import annotations

import argparse
import sys

from soakmatrix.matrix.paths import empty_store_warning
from soakmatrix.matrix.run import add_run_options, execute, make_plan
from soakmatrix.matrix.spec import load_matrix

HELP = ("Run a matrix profile on Ray: one task per cell on a node with the right GPU type and count; "
        "a local cluster with simulated GPUs unless --ray-address or RAY_ADDRESS names one.")
OUTLIVES_ITS_READER = True   # hours of work whose results are in files: a closed stderr does not end it


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser)


def main(args: argparse.Namespace) -> int:
    warning = empty_store_warning("--store", args.store)
    if warning:
        print(f"soakmatrix run: {warning}", file=sys.stderr)
    matrix = load_matrix(args.matrix)
    profile = matrix.profile(args.profile)
    planned = make_plan(matrix, profile, args.backend)
    return execute(matrix, profile, planned.cells, args, kind="run")
