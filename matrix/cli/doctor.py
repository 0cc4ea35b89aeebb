"""`soakmatrix doctor`: check that this node can run cells (jobs/doctor): GPUs of the matrix's type and
free, NVML, ptrace for py-spy, /dev/shm, vLLM built for the driver's CUDA, Xid errors.

Exit codes: 0 every check passed (warnings allowed), 3 a check failed (the node is not fit: an
infrastructure problem, kept apart from 1, a hang found), 2 usage (a bad --matrix or --gpu).
"""

from __future__ import annotations

import argparse
import json
import sys

from soakmatrix.jobs.doctor import GPU_BACKENDS, run_doctor
from soakmatrix.jobs.doctor.checks import GpuExpectation
from soakmatrix.matrix.arguments import text
from soakmatrix.matrix.contracts.outcomes import EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.paths import CONFIG_FILE

HELP = (
    "Check this node before cells run on it: its GPUs (and their type as a matrix names them), that they are "
    "free, NVML, ptrace for py-spy, /dev/shm, vLLM built for the driver's CUDA, Xid errors. "
    "Exit 0: fit (warnings allowed); 3: a check failed; 2: usage."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--matrix", type=CONFIG_FILE, help="matrix YAML file whose gpus: section names this node's GPU type"
    )
    parser.add_argument("--gpu", type=text, help="the matrix's GPU type this node is to run (with --matrix)")
    parser.add_argument(
        "--backend",
        choices=("vllm", "sim"),
        default="vllm",
        help="the engine cells will run: sim checks no GPU (default: vllm)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document, stable for scripts")


def expectation(matrix_file: str | None, gpu: str | None) -> GpuExpectation | None:
    """The matrix's GPU type, or None when none is asked for; a usage error names what is wrong."""
    if gpu and not matrix_file:
        raise UsageError("--gpu needs --matrix (the file whose gpus: section names the type)")
    if not matrix_file:
        return None
    from soakmatrix.matrix.spec import load_matrix

    matrix = load_matrix(matrix_file)
    if gpu is None:
        if len(matrix.gpus) != 1:
            raise UsageError(
                f"{matrix_file} names {len(matrix.gpus)} GPU types ({', '.join(matrix.gpus)}): say which with --gpu"
            )
        gpu = next(iter(matrix.gpus))
    if gpu not in matrix.gpus:
        raise UsageError(f"--gpu {gpu}: not in {matrix_file}'s gpus: ({', '.join(matrix.gpus)})")
    t = matrix.gpus[gpu]
    return GpuExpectation(gpu, t.ray_label, t.count)


class UsageError(ValueError):
    pass


def main(args: argparse.Namespace) -> int:
    try:
        expected = expectation(args.matrix, args.gpu)
    except UsageError as exc:
        print(f"soakmatrix doctor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if expected is not None and args.backend not in GPU_BACKENDS:
        print(
            f"soakmatrix doctor: note: the {args.backend} backend runs no GPU; --gpu {expected.type_name} "
            "is not checked",
            file=sys.stderr,
        )
    report = run_doctor(args.backend, expected)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(report.text())
    return EXIT_OK if report.ok else EXIT_INFRA
