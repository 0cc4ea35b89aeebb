"""Planning: expand a matrix profile into cells with their argv, GPUs and cost.

Order of decisions: the product (or a t-way covering array) of model x GPU x workload x axes;
`exclude` entries remove partial matches; `include` entries merge into or add combinations
(GitHub Actions semantics); then the built-in constraints, each exclusion kept with its reason
(the rules themselves are in `constraints`). In a matrix with `builds:`, every combination that
survives is then planned once per build of the profile (builds are crossed in full, never t-way: a
regression is seen by comparing one combination across builds). All of it is pure: vLLM validation
is passed in as a function.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from soakmatrix.matrix.contracts.flags import ArgvBuilder, format_value
from soakmatrix.matrix.contracts.redact import redact_argv, redact_env, redact_text
from soakmatrix.matrix.contracts.yamlsrc import Problem

from .cells import Cell
from .constraints import Checker, Exclusion, apply_include, argv_builder, rule_matches, violations
from .coverage import covering_array as default_array
from .spec import CELL_KEYS, Build, Matrix, Profile, SpecError


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    model_path: str
    serve_args: tuple[str, ...]  # everything after `vllm serve MODEL`
    env: Mapping[str, str]
    gpu_count: int
    ray_label: str
    soak_s: float
    startup_s: float
    build: Build | None = None  # the engine build (matrix `builds:`); None: the engine on the nodes

    @property
    def id(self) -> str:
        return self.cell.id

    @property
    def name(self) -> str:
        return self.cell.name

    @property
    def command(self) -> list[str]:
        return ["vllm", "serve", self.model_path, *self.serve_args]

    @property
    def gpu_hours(self) -> float:
        return self.gpu_count * (self.startup_s + self.soak_s) / 3600.0


@dataclass
class Plan:
    matrix: Matrix
    profile: Profile
    cells: list[PlannedCell]
    excluded: list[Exclusion]
    rejected: list[Exclusion] = field(default_factory=list)  # refused by vLLM's own parser
    validation: str = "not run"
    product_size: int = 0
    coverage: str = "full"

    def cost_by_gpu(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for pc in self.cells:
            row = out.setdefault(pc.cell.gpu, {"cells": 0, "gpus": 0, "gpu_hours": 0.0})
            row["cells"] += 1
            row["gpus"] += pc.gpu_count
            row["gpu_hours"] += pc.gpu_hours
        return out

    @property
    def gpu_hours(self) -> float:
        return sum(pc.gpu_hours for pc in self.cells)

    @property
    def excluded_count(self) -> int:
        return sum(e.count for e in self.excluded)

    @property
    def over_budget(self) -> bool:
        budget = self.profile.budget_gpu_hours
        return budget is not None and self.gpu_hours > budget + 1e-9

    def to_json(self) -> dict[str, Any]:
        doc = self._json()
        if self.matrix.builds:  # only then: plans of matrices without builds stay byte-identical
            doc["builds"] = [
                {"name": b.name, "ordinal": b.ordinal, "kind": b.kind, "value": redact_text(b.value)}
                for b in self.matrix.builds.values()
            ]
            for cell, pc in zip(doc["cells"], self.cells, strict=True):
                cell["build"] = pc.cell.build
        return doc

    def _json(self) -> dict[str, Any]:
        return {
            "matrix": self.matrix.file,
            "profile": self.profile.name,
            "coverage": self.coverage,
            "product_size": self.product_size,
            "soak_s": self.profile.soak_s,
            "validation": self.validation,
            "cells": planned_dicts(self.cells),
            "excluded": [{"combo": _jsonable(e.combo), "reason": e.reason, "count": e.count} for e in self.excluded],
            "excluded_count": self.excluded_count,
            "rejected": [{"combo": _jsonable(e.combo), "reason": e.reason} for e in self.rejected],
            "cost": {
                "by_gpu": {g: {k: round(v, 4) for k, v in row.items()} for g, row in self.cost_by_gpu().items()},
                "gpu_hours": round(self.gpu_hours, 4),
                "budget_gpu_hours": self.profile.budget_gpu_hours,
                "over_budget": self.over_budget,
            },
        }


def _jsonable(combo: Mapping[str, Any]) -> dict[str, Any]:
    return dict(combo)


# -- planning ---------------------------------------------------------------------------------------


def factors_of(matrix: Matrix, profile: Profile) -> dict[str, list[Any]]:
    factors: dict[str, list[Any]] = {
        "model": list(profile.models or matrix.models),
        "gpu": list(profile.gpus or matrix.gpus),
        "workload": list(profile.workloads),
    }
    for name, values in matrix.axes.items():
        factors[name] = list(values)
    return factors


def pruned_product(
    factors: Mapping[str, Sequence[Any]], matrix: Matrix, checker: Checker, excluded: list[Exclusion]
) -> Iterator[dict]:
    """The full product with exclude rules and constraints decided once per slice: only the keys
    they read are enumerated first, and an excluded slice is recorded once with its size."""
    rule_keys = {k for rule in matrix.exclude for k in rule}
    deciding = [k for k in factors if k in checker.read_keys or k in rule_keys]
    free = [k for k in factors if k not in deciding]
    tails = list(itertools.product(*(factors[k] for k in free)))
    for head in itertools.product(*(factors[k] for k in deciding)):
        part = dict(zip(deciding, head, strict=True))
        hit = next((i for i, rule in enumerate(matrix.exclude) if rule_matches(rule, part)), None)
        reason = f"exclude[{hit}]" if hit is not None else "; ".join(checker.violations(part))
        if reason:
            excluded.append(Exclusion(part, reason, len(tails)))
            continue
        for tail in tails:
            combo = dict(part)
            combo.update(zip(free, tail, strict=True))
            yield combo


# Planning the full product enumerates it; past this a t-way array is the only sane choice
# (311,040 combinations plan in 1.8 s, benchmarks/bench_plan.py).
MAX_FULL_PRODUCT = 1_000_000


def product_size(factors: Mapping[str, Sequence[Any]]) -> int:
    return math.prod(len(v) for v in factors.values())


def plan(
    matrix: Matrix,
    profile_name: str | None = None,
    validate: Callable[[list[PlannedCell]], tuple[str, dict[str, str]]] | None = None,
    covering_array: Callable[..., list[dict]] | None = None,
) -> Plan:
    """Expand a profile of a matrix into a Plan.

    `validate(cells) -> (status, {cell id: vLLM's message})` checks argv with vLLM's parser;
    `covering_array(factors, strength, allowed)` builds a t-way array (default: covertable).
    """
    profile = matrix.profile(profile_name)
    factors = factors_of(matrix, profile)
    excluded: list[Exclusion] = []
    size = product_size(factors)
    if profile.coverage is None and size > MAX_FULL_PRODUCT:
        raise SpecError(
            [
                Problem(
                    matrix.file,
                    matrix.line_of("profiles", profile.name, "coverage"),
                    f"profiles.{profile.name}.coverage",
                    f"the full product is {size:,} combinations (at most {MAX_FULL_PRODUCT:,}); "
                    "use t-way coverage ({t: 2} or {t: 3}) or fewer axis values",
                )
            ]
        )

    checker = Checker(matrix)
    if profile.coverage is None:
        combos: Iterable[dict] = pruned_product(factors, matrix, checker, excluded)
        coverage = "full"
    else:
        builder = covering_array or default_array

        def allowed(combo: Mapping[str, Any]) -> bool:
            return not any(rule_matches(r, combo) for r in matrix.exclude) and not violations(combo, matrix)

        combos = builder(factors, profile.coverage, allowed, matrix)
        coverage = f"{profile.coverage}-way"

    # without include, every combination has already passed the constraints
    recheck = bool(matrix.include) or profile.coverage is not None
    if matrix.include:
        combos = apply_include(list(combos), matrix.include, factors)

    problems = []
    builds = profile_builds(matrix, profile)
    cells: list[PlannedCell] = []
    seen: set[Cell] = set()
    argv_of = argv_builder(matrix.registry)
    for combo in combos:
        missing = [k for k in ("model", "gpu") if k not in combo]
        if missing:
            line = _include_line(matrix, combo)
            problems.append(
                Problem(matrix.file, line, "include", f"adds a combination without {' and '.join(missing)}: {combo}")
            )
            continue
        combo.setdefault("workload", profile.workloads[0])
        reasons = checker.violations(combo) if recheck else ()
        if reasons:
            excluded.append(Exclusion(combo, "; ".join(reasons)))
            continue
        for build in builds:
            pc = planned_cell(matrix, profile, combo, argv_of, build)
            if pc.cell in seen:
                continue
            seen.add(pc.cell)
            cells.append(pc)
    if problems:
        raise SpecError(problems)
    if not cells:
        raise SpecError(
            [
                Problem(
                    matrix.file,
                    matrix.line_of("profiles", profile.name),
                    f"profiles.{profile.name}",
                    f"selects no cell: all {size:,} combinations are excluded"
                    + (f" (first: {excluded[0].reason})" if excluded else "")
                    + "; a run of nothing would read as a pass",
                )
            ]
        )

    result = Plan(matrix, profile, cells, excluded, product_size=size, coverage=coverage)
    if validate is not None:
        status, rejected = validate(cells)
        result.validation = status
        if rejected:
            result.rejected = [Exclusion(_combo_of(pc), rejected[pc.id]) for pc in cells if pc.id in rejected]
            result.cells = [pc for pc in cells if pc.id not in rejected]
    return result


def _include_line(matrix: Matrix, combo: Mapping[str, Any]) -> int:
    for i, entry in enumerate(matrix.include):
        if dict(entry) == dict(combo):
            return matrix.include_lines[i] if i < len(matrix.include_lines) else 0
    return matrix.include_lines[0] if matrix.include_lines else 0


def _combo_of(pc: PlannedCell) -> dict[str, Any]:
    return {"model": pc.cell.model, "gpu": pc.cell.gpu, "workload": pc.cell.workload, **pc.cell.flag_dict}


def profile_builds(matrix: Matrix, profile: Profile) -> list[Build | None]:
    """The builds a profile runs, in history order; [None] for a matrix without builds."""
    if not matrix.builds:
        return [None]
    names = profile.builds or tuple(matrix.builds)
    chosen = sorted((matrix.builds[n] for n in dict.fromkeys(names)), key=lambda b: b.ordinal)
    return [*chosen]


def planned_cell(
    matrix: Matrix,
    profile: Profile,
    combo: Mapping[str, Any],
    builder: ArgvBuilder | None = None,
    build: Build | None = None,
) -> PlannedCell:
    flags = {k: v for k, v in combo.items() if k not in CELL_KEYS}
    cell = Cell.make(combo["model"], combo["gpu"], flags, combo["workload"], build.name if build else "")
    model, gpu = matrix.models[cell.model], matrix.gpus[cell.gpu]
    argv, env = (builder or argv_builder(matrix.registry)).build(flags)
    return PlannedCell(
        cell, model.path, (*model.args, *argv), env, cell.tp, gpu.ray_label, profile.soak_s, profile.startup_s, build
    )


def describe_combo(combo: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in combo.items())


def planned_dicts(cells: Sequence[PlannedCell]) -> list[dict[str, Any]]:
    """The cells as `soakmatrix plan --json` and the history store's `planned` describe them."""
    return [
        {
            "id": pc.id,
            "name": pc.name,
            "model": pc.cell.model,
            "gpu": pc.cell.gpu,
            "gpu_count": pc.gpu_count,
            "ray_label": pc.ray_label,
            "workload": pc.cell.workload,
            "flags": pc.cell.flag_dict,
            "command": redact_argv(pc.command),
            "env": redact_env(pc.env),
            "gpu_hours": round(pc.gpu_hours, 4),
        }
        for pc in cells
    ]
