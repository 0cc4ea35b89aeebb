"""`soakmatrix smoke`: the pull-request matrix: t-way coverage, short soaks, a GPU-hour budget.

From the smoke profile's plan it keeps the cells a change touches (`--changed-files`, through the
matrix's `source_dependencies`), orders them so the most informative run first, trims them to the
budget, and runs them like `soakmatrix run` (optionally stopping at the first finding).
"""

from __future__ import annotations

import argparse
import sys

from soakmatrix.api.matrices import load_matrix, plan
from soakmatrix.api.running import run
from soakmatrix.matrix.arguments import positive_number
from soakmatrix.matrix.contracts.outcomes import EXIT_OK
from soakmatrix.matrix.contracts.yamlsrc import LIMITS, Problem, decode, read_text
from soakmatrix.matrix.paths import CONFIG_OR_STDIN, empty_store_warning
from soakmatrix.matrix.run import add_run_options, say_rejected
from soakmatrix.matrix.run_types import RunOptions
from soakmatrix.matrix.smoke_selection import (
    cells_touching,
    informative_order,
    read_changed_files,
    touched_flags,
    trim_to_budget,
)
from soakmatrix.matrix.spec import Matrix, SpecError

HELP = (
    "The pull-request smoke matrix: the smoke profile's t-way cells that the change touches, "
    "most informative first, within a GPU-hour budget."
)
OUTLIVES_ITS_READER = True  # hours of work whose results are in files: a closed stderr does not end it

DEFAULT_PROFILE = "smoke"


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser, default_profile=f"{DEFAULT_PROFILE!r} if the matrix has it, else the first")
    parser.add_argument(
        "--changed-files",
        metavar="FILE|-",
        type=CONFIG_OR_STDIN,
        help="paths changed by the PR, one per line (`git diff --name-only`); - reads stdin",
    )
    parser.add_argument("--fail-fast", action="store_true", help="cancel the rest at the first hang or crash")
    parser.add_argument(
        "--budget",
        type=positive_number,
        metavar="GPU_HOURS",
        help="GPU-hour budget (above 0 and at most 1,000,000; default: the profile's budget_gpu_hours)",
    )


def profile_name(matrix: Matrix, requested: str | None) -> str | None:
    if requested:
        return requested
    return DEFAULT_PROFILE if DEFAULT_PROFILE in matrix.profiles else None


def read_changed(source: str) -> list[str]:
    """The changed-files list, read within the same limits as every input file (size, UTF-8, no NUL)."""
    if source == "-":
        name, raw = "<stdin>", sys.stdin.buffer.read(LIMITS.max_bytes + 1)
        if len(raw) > LIMITS.max_bytes:
            raise SpecError([Problem(name, 0, "--changed-files", f"more than {LIMITS.max_bytes // 1024} KiB")])
        text = decode(name, raw)
    else:
        name, text = source, read_text(source, what="changed-files list")
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise SpecError([Problem(name, line, "--changed-files", "a NUL byte: not a list of paths")])
    return read_changed_files(text)


def main(args: argparse.Namespace) -> int:
    warning = empty_store_warning("--store", args.store)
    if warning:
        print(f"soakmatrix smoke: {warning}", file=sys.stderr)
    matrix = load_matrix(args.matrix)
    profile = matrix.profile(profile_name(matrix, args.profile))
    cells = plan(matrix, profile.name, backend=args.backend, on_rejected=say_rejected).cells
    out = sys.stderr
    focus: set[str] = set()
    if args.changed_files is not None:
        changed = read_changed(args.changed_files)
        if not matrix.source_dependencies:
            print("smoke: the matrix has no source_dependencies; every cell is relevant", file=out)
        else:
            touched = touched_flags(changed, matrix.source_dependencies)
            focus = set(touched)
            for flag, files in sorted(touched.items()):
                print(f"smoke: {flag} <- {', '.join(files[:3])}{' ...' if len(files) > 3 else ''}", file=out)
            cells = cells_touching(cells, focus, matrix.baseline)
            if not cells:
                print(
                    f"smoke: none of the {len(changed)} changed file(s) maps to a flag of the matrix; nothing to soak",
                    file=out,
                )
                return EXIT_OK
    ordered = informative_order(cells, profile.coverage or 2, matrix.baseline, focus)
    budget = args.budget if args.budget is not None else profile.budget_gpu_hours
    trimmed = trim_to_budget(ordered, budget)
    if trimmed.dropped:
        print(
            f"smoke: budget {budget:g} GPU-h: running {len(trimmed.kept)} of {len(ordered)} cells "
            f"({trimmed.gpu_hours:.2f} GPU-h); {len(trimmed.dropped)} least informative dropped",
            file=out,
        )
    if not trimmed.kept:
        print("smoke: no cell fits the budget", file=out)
        return EXIT_OK
    return run(
        matrix,
        profile=profile.name,
        cells=trimmed.kept,
        options=RunOptions.from_args(args),
        kind="smoke",
        fail_fast=args.fail_fast,
        keep_order=True,
    ).exit_code
