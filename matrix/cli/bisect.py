"""`soakmatrix bisect`: the smallest set of flags that still hangs like a failing cell, with confidence.

Builds the elements (flags that differ from the matrix baseline; those that cannot move are
context), the oracle (virtual time from a hang model, or soak jobs on Ray) and runs
`matrix.bisect.bisect`; prints the table or JSON, optionally writes a pytest regression test.
Exit codes: 1 a minimal set was found (a hang), 0 the failing cell did not reproduce, 3 inconclusive
(budget exhausted), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from soakmatrix.matrix import bisect as bis
from soakmatrix.matrix.bisect.report import render_text, to_json
from soakmatrix.matrix.contracts.durations import format_duration, parse_duration
from soakmatrix.matrix.contracts.outcomes import EXIT_FOUND, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from soakmatrix.matrix.plan import PlannedCell, plan, violations
from soakmatrix.matrix.spec import Matrix, load_matrix

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
    parser.add_argument("--modifier-prior", type=_probability, default=bis.Settings.modifier_prior,
                        help="prior probability that one flag outside the set slows the hang x6 or more; the rate "
                             "check after the search settles whether it is needed to hang within the cap "
                             f"(default {bis.Settings.modifier_prior}; 0 skips the check)")
    parser.add_argument("--no-shrink", action="store_true", help="do not try other values of the set's flags")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--emit-test", metavar="PATH", help="write a pytest regression test for the minimal set")
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--ray-address", help="Ray cluster address (default: RAY_ADDRESS or a local cluster)")
    parser.add_argument("--out", default="bisect-out", help="soak job artifacts (real probes)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--store", metavar="FILE",
                        help="history store (SQLite) to record the result in; `soakmatrix report` shows it")


def find_cell(cells: list[PlannedCell], key: str, matrix: Matrix) -> PlannedCell:
    for pc in cells:
        if key in (pc.id, pc.name):
            return pc
    matches = [pc for pc in cells if pc.id.startswith(key)] if len(key) >= 4 else []
    if len(matches) == 1:
        return matches[0]
    raise LookupError(f"{matrix.file}: no cell {key!r} in the plan"
                      + (f" ({len(matches)} ids start with it)" if matches else "")
                      + "; `soakmatrix plan` lists ids and names")


def combo_of(pc: PlannedCell, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"model": pc.cell.model, "gpu": pc.cell.gpu, "workload": pc.cell.workload,
            **(pc.cell.flag_dict if flags is None else flags)}


def elements_of(pc: PlannedCell, matrix: Matrix) -> tuple[list[bis.Element], list[bis.Element], dict[str, str]]:
    """Movable elements, context elements and why each context flag cannot move."""
    flags = pc.cell.flag_dict
    movable, fixed, why = [], [], {}
    for name, value in flags.items():
        if name not in matrix.baseline:
            continue
        base = matrix.baseline[name]
        if value == base and isinstance(value, bool) == isinstance(base, bool):
            continue
        element = bis.Element(name, value, base)
        reasons = violations(combo_of(pc, {**flags, name: base}), matrix)
        if reasons:
            fixed.append(element)
            why[name] = "; ".join(reasons)
        else:
            movable.append(element)
    return movable, fixed, why


def alternatives_of(elements: list[bis.Element], matrix: Matrix) -> dict[str, list[Any]]:
    """Values to try once the set is known, from the failing value toward the baseline:
    integers halve (TP 8 -> 4 -> 2), choices try every other choice."""
    out: dict[str, list[Any]] = {}
    for e in elements:
        flag = matrix.registry.get(e.name)
        if flag is None or flag.kind == "bool":
            continue
        if flag.kind == "int" and isinstance(e.value, int) and isinstance(e.baseline, int):
            values, v = [], e.value
            while True:
                v = v // 2 if e.value > e.baseline else v * 2
                if (e.value > e.baseline and v <= e.baseline) or (e.value < e.baseline and v >= e.baseline) or v in values:
                    break
                values.append(v)
            if values:
                out[e.name] = values
        elif flag.choices:
            others = [c for c in flag.choices if c not in (e.value, e.baseline)]
            if others:
                out[e.name] = others
    return out


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
    if len(movable) > bis.MAX_ELEMENTS:
        print(f"soakmatrix bisect: {len(movable)} flags differ from the baseline; at most {bis.MAX_ELEMENTS}",
              file=sys.stderr)
        return EXIT_USAGE

    def feasible(flags: Mapping[str, Any]) -> str | None:
        reasons = violations(combo_of(pc, flags), matrix)
        return "; ".join(reasons) if reasons else None

    hang_model_path = args.hang_model or matrix.sim.hang_model
    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    cluster = None
    if args.virtual:
        if not hang_model_path:
            print("soakmatrix bisect: --virtual needs a hang model: --hang-model FILE or the matrix's sim.hang_model",
                  file=sys.stderr)
            return EXIT_USAGE
        from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
        from soakmatrix.matrix.contracts.hangmodel import load_hang_model
        model = load_hang_model(hang_model_path, registry=matrix.registry)
        concurrency = matrix.workloads[pc.cell.workload].params.get("concurrency")
        oracle = VirtualOracle(model, pc.cell.gpu, startup_s=profile.startup_s, seed=args.seed,
                               concurrency=concurrency if isinstance(concurrency, int) else None,
                               registry=matrix.registry)
        parallel = args.parallel or 1
    else:
        from soakmatrix.matrix.bisect.oracle_soak import SoakOracle
        from soakmatrix.matrix.schedule.cluster import address_from, connect
        cluster = connect(address_from(args.ray_address), backend=args.backend, gpus=matrix.gpus)
        if progress:
            progress(f"soakmatrix bisect: on {cluster.description}")
        oracle = SoakOracle(matrix, profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                            backend=args.backend, out_dir=args.out)
        parallel = args.parallel or 2
    settings = bis.Settings(confidence=args.confidence, mttf_cap_s=cap, startup_s=profile.startup_s,
                            calibration_hangs=max(1, args.calibration_hangs), parallel=max(1, parallel),
                            max_probes=args.max_probes, budget_gpu_hours=args.budget_gpu_hours,
                            shrink_values=not args.no_shrink, modifier_prior=args.modifier_prior)
    if progress:
        progress(f"soakmatrix bisect: cell {pc.id} {pc.name}: {len(movable)} flag(s) differ from the baseline "
                 f"({', '.join(e.name for e in movable) or 'none'})"
                 + (f"; context: {', '.join(why)}" if why else ""))
    try:
        result = bis.bisect(pc.cell.flag_dict, movable, oracle, settings, context=why, context_elements=fixed,
                            alternatives=alternatives_of(movable, matrix), feasible=feasible, progress=progress)
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
            path = Path(args.emit_test)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(regression_test(result, pc, matrix, args.backend, hang_model_path))
            if progress:
                progress(f"soakmatrix bisect: wrote {path}")
    return {"found": EXIT_FOUND, "not_reproduced": EXIT_OK}.get(result.status, EXIT_INFRA)


def regression_test(result: bis.BisectResult, pc: PlannedCell, matrix: Matrix, backend: str,
                    hang_model: str | None) -> str:
    """A pytest file (the `fixtures/` soak marker) soaking the minimal set for the certified duration."""
    workload = matrix.workloads[pc.cell.workload]
    wl = {"name": workload.name, "kind": workload.kind, **dict(workload.params)}
    flags = dict(result.minimal_flags)
    sig = result.signature or "hang"
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", f"{sig}_{'_'.join(result.minimal) or 'baseline'}").strip("_").lower()
    duration = round(result.certified_soak_s or 0.0, 1)
    model_path = matrix.models[pc.cell.model].path
    return f'''"""Regression test written by `soakmatrix bisect` for cell {pc.id} ({pc.name}).

Minimal set: {", ".join(result.minimal) or "(baseline)"}; posterior {result.posterior:.4f} at stated confidence
{result.confidence:g}; the soak ({format_duration(duration)}) sees the hang with probability >= {result.confidence:g}.
"""

import pytest


@pytest.mark.soak(model={model_path!r}, engine={backend!r}, flags={flags!r},
                  duration={duration!r}, workload={wl!r},
                  gpu_type={pc.cell.gpu!r}, hang_model={hang_model!r}, time_scale={matrix.sim.time_scale!r},
                  expect="pass")
def test_{name}():
    """Regression test for {sig}: soaks the minimal set for the certified duration."""
'''
