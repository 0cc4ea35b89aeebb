"""`soakmatrix plan`: print the cells a profile will run, what was excluded and why, and the cost."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from soakmatrix.matrix.arguments import text
from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.redact import redact_argv, redact_env, redact_text
from soakmatrix.matrix.paths import CONFIG_FILE
from soakmatrix.matrix.plan import Plan, describe_combo, plan
from soakmatrix.matrix.spec import load_matrix

HELP = "Show which cells a matrix profile runs, with which `vllm serve` command, on which GPUs, at what cost."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("matrix", type=CONFIG_FILE, help="matrix YAML file")
    parser.add_argument("--profile", type=text, help="profile name (default: the first)")
    parser.add_argument("--json", action="store_true", help="one JSON document, stable for scripts")
    parser.add_argument("--no-validate", action="store_true", help="skip vLLM's own argv check")
    parser.add_argument("--all-excluded", action="store_true", help="list every excluded combination")


def main(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    validate = None
    if not args.no_validate:
        from soakmatrix.matrix.validate import validate_cells

        validate = validate_cells
    result = plan(matrix, args.profile, validate=validate)
    if args.no_validate:
        result.validation = "skipped: --no-validate"
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result, all_excluded=args.all_excluded))
    return 0


def render(result: Plan, all_excluded: bool = False) -> str:
    p = result.profile
    out = [
        f"matrix {result.matrix.name} ({result.matrix.file}), profile {p.name}: "
        f"{len(result.cells)} cells ({result.coverage} coverage of {result.product_size} combinations), "
        f"soak {format_duration(p.soak_s)} + start-up {format_duration(p.startup_s)} each",
        f"vLLM argv check: {result.validation}",
        "",
    ]
    if result.matrix.builds:
        out.append("builds (history order), through Ray's runtime_env:")
        out += [f"  {b.ordinal}  {b.name}  {b.kind}: {redact_text(b.value)}" for b in result.matrix.builds.values()]
        out.append("")
    for pc in result.cells:
        out.append(f"{pc.id}  {pc.name}")
        if pc.build is not None:
            out.append(
                f"    build {pc.build.name} (#{pc.build.ordinal})  {pc.build.kind}: {redact_text(pc.build.value)}"
            )
        out.append(
            f"    {pc.cell.gpu} x{pc.gpu_count}  {pc.gpu_hours:.2f} GPU-h  $ {' '.join(_quote(a) for a in redact_argv(pc.command))}"
        )
        if pc.env:
            out.append("    env " + " ".join(f"{k}={v}" for k, v in redact_env(pc.env).items()))
    if result.rejected:
        out += ["", f"rejected by vLLM ({len(result.rejected)}):"]
        out += [f"  {describe_combo(e.combo)}: {e.reason}" for e in result.rejected]
    if result.excluded:
        out += ["", f"excluded ({result.excluded_count} of {result.product_size} combinations):"]
        if all_excluded or len(result.excluded) <= 20:
            out += [f"  {_times(e.count)}{describe_combo(e.combo)}: {e.reason}" for e in result.excluded]
        else:
            by_reason: Counter[str] = Counter()
            for e in result.excluded:
                by_reason[e.reason] += e.count
            for reason, n in by_reason.most_common():
                out.append(f"  {n:6d} x {reason}")
            out.append("  (--all-excluded lists each one)")
    out += ["", "cost:"]
    for gpu, row in sorted(result.cost_by_gpu().items()):
        out.append(f"  {gpu:<12} {row['cells']:5d} cells  {row['gpu_hours']:9.2f} GPU-h")
    budget = p.budget_gpu_hours
    total = f"  {'total':<12} {len(result.cells):5d} cells  {result.gpu_hours:9.2f} GPU-h"
    if budget is not None:
        total += f"  (budget {budget:g} GPU-h{', OVER BUDGET' if result.over_budget else ''})"
    out.append(total)
    return "\n".join(out) + "\n"


def _times(count: int) -> str:
    return f"{count} x " if count > 1 else ""


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
