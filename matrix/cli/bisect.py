"""`soakmatrix bisect`: the smallest set of flags that still hangs like a failing cell, with confidence.

Reads the options, sets the bisection up from the matrix (`matrix.bisect.setup`: the cell, its
elements and context, the oracle: virtual time from a hang model, or soak jobs on Ray), runs
`matrix.bisect.bisect`, prints the table or JSON and optionally writes a pytest regression test
(`matrix.bisect.emit`). Exit codes: 1 a minimal set was found (a hang), 0 the failing cell did not
reproduce, 3 inconclusive (budget exhausted), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys

from soakmatrix.matrix.bisect import MAX_ELEMENTS, Settings, bisect
from soakmatrix.matrix.bisect.emit import write_regression_test
from soakmatrix.matrix.bisect.report import render_text, to_json
from soakmatrix.matrix.bisect.setup import (
    alternatives_of,
    elements_of,
    feasibility,
    find_cell,
    soak_oracle,
    virtual_oracle,
)
from soakmatrix.matrix.contracts.durations import parse_duration
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.spec import load_matrix

HELP = ("Find the smallest set of flags (relative to the matrix baseline) that still hangs with the failing "
        "cell's signature, with stated confidence, spending few GPU-hours.")


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 0 and below 1")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("matrix", help="matrix YAML file")
    parser.add_argument("--cell", required=True, help="the failing cell: its id or its name (see `soakmatrix plan`)")
    parser.add_argument("--profile", help="profile (default: the first); gives start-up time and retries")
    parser.add_argument("--confidence", type=float, default=0.95, help="stated confidence (default 0.95)")
    parser.add_argument("--mttf-cap", help="a set hangs only if its MTTF is at most this (e.g. 6h); "
                                           "default: 2 x the failing cell's MTTF 99%% upper bound while few hangs "
                                           "are pooled, settling at 3 x the pooled MTTF (at most 4 x the first cap)")
    parser.add_argument("--virtual", action="store_true", help="virtual time: draw hangs from the hang model")
    parser.add_argument("--hang-model", help="hang-model file (default: the matrix's sim.hang_model)")
    parser.add_argument("--seed", type=int, help="virtual oracle seed (default: the hang model's)")
    parser.add_argument("--calibration-hangs", type=int, default=2, help="hangs of the failing cell first (default 2)")
    parser.add_argument("--parallel", type=int, default=None, help="probes per batch (default 1 virtual, 2 on Ray; more finish sooner but spend more GPU-hours)")
    parser.add_argument("--budget-gpu-hours", type=float, help="stop (inconclusive) after this many GPU-hours")
    parser.add_argument("--max-probes", type=int, default=200)
    parser.add_argument("--modifier-prior", type=_probability, default=Settings.modifier_prior,
                        help="prior probability that one flag outside the set slows the hang x6 or more; the rate "
                             "check after the search settles whether it is needed to hang within the cap "
                             f"(default {Settings.modifier_prior}; 0 skips the check)")
    parser.add_argument("--no-shrink", action="store_true", help="do not try other values of the set's flags")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--emit-test", metavar="PATH", help="write a pytest regression test for the minimal set")
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--ray-address", help="Ray cluster address (default: RAY_ADDRESS or a local cluster)")
    parser.add_argument("--out", default="bisect-out", help="soak job artifacts (real probes)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--store", metavar="FILE",
                        help="history store (SQLite) to record the result in; `soakmatrix report` shows it")



def main(args: argparse.Namespace) -> int:
    if not 0.0 < args.confidence < 1.0:
        print("soakmatrix bisect: --confidence must be between 0 and 1 (e.g. 0.95)", file=sys.stderr)
        return EXIT_USAGE
    try:
        cap = parse_duration(args.mttf_cap) if args.mttf_cap else None
    except ValueError as exc:
        print(f"soakmatrix bisect: --mttf-cap: {exc}", file=sys.stderr)
        return EXIT_USAGE
    matrix = load_matrix(args.matrix)
    result_plan = plan(matrix, args.profile)
    try:
        pc = find_cell(result_plan.cells, args.cell, matrix)
    except LookupError as exc:
        print(f"soakmatrix bisect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    profile = result_plan.profile
    movable, fixed, why = elements_of(pc, matrix)
    if len(movable) > MAX_ELEMENTS:
        print(f"soakmatrix bisect: {len(movable)} flags differ from the baseline; at most {MAX_ELEMENTS}",
              file=sys.stderr)
        return EXIT_USAGE

    hang_model_path = args.hang_model or matrix.sim.hang_model
    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    cluster = None
    if args.virtual:
        if not hang_model_path:
            print("soakmatrix bisect: --virtual needs a hang model: --hang-model FILE or the matrix's sim.hang_model",
                  file=sys.stderr)
            return EXIT_USAGE
        oracle = virtual_oracle(matrix, pc, profile, hang_model_path, args.seed)
        parallel = args.parallel or 1
    else:
        oracle, cluster = soak_oracle(matrix, pc, profile, backend=args.backend, ray_address=args.ray_address,
                                      out_dir=args.out)
        if progress:
            progress(f"soakmatrix bisect: on {cluster.description}")
        parallel = args.parallel or 2
    settings = Settings(confidence=args.confidence, mttf_cap_s=cap, startup_s=profile.startup_s,
                        calibration_hangs=max(1, args.calibration_hangs), parallel=max(1, parallel),
                        max_probes=args.max_probes, budget_gpu_hours=args.budget_gpu_hours,
                        shrink_values=not args.no_shrink, modifier_prior=args.modifier_prior)
    if progress:
        progress(f"soakmatrix bisect: cell {pc.id} {pc.name}: {len(movable)} flag(s) differ from the baseline "
                 f"({', '.join(e.name for e in movable) or 'none'})"
                 + (f"; context: {', '.join(why)}" if why else ""))
    try:
        result = bisect(pc.cell.flag_dict, movable, oracle, settings, context=why, context_elements=fixed,
                        alternatives=alternatives_of(movable, matrix), feasible=feasibility(pc, matrix),
                        progress=progress)
    finally:
        if cluster is not None:
            cluster.close()
    doc = to_json(result)
    doc.update({"matrix": matrix.file, "cell": {"id": pc.id, "name": pc.name},
                "oracle": "virtual" if args.virtual else f"soak ({args.backend})"})
    if args.store:
        from soakmatrix.reports.history import HistoryStore

        with HistoryStore(args.store) as store:
            store.record_bisection(pc.id, doc)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(f"cell {pc.id}  {pc.name}\n")
        sys.stdout.write(render_text(result))
    if args.emit_test:
        if result.status != "found":
            print("soakmatrix bisect: no minimal set, so no regression test written", file=sys.stderr)
        else:
            path = write_regression_test(args.emit_test, result, pc, matrix, args.backend, hang_model_path)
            if progress:
                progress(f"soakmatrix bisect: wrote {path}")
    return {"found": EXIT_FOUND, "not_reproduced": EXIT_OK}.get(result.status, EXIT_INFRA)
