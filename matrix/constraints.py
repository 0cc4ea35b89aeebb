"""The rules that decide which combinations of a matrix run: the built-in constraints (each with the
keys it reads and the reason a combination breaks it) and include/exclude (GitHub Actions semantics).

Planning and the covering-array builder both read them; pure, the matrix is an input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from soakmatrix.matrix.contracts.flags import ArgvBuilder, ArgvConflict, Flag

from .spec import CELL_KEYS, Matrix

GPU_MEMORY_FRACTION = 0.9  # vLLM's default --gpu-memory-utilization


@dataclass(frozen=True)
class Exclusion:
    """A combination left out of the plan, and why (an exclude rule, a constraint, vLLM's parser)."""

    combo: Mapping[str, Any]  # the deciding keys only, when a whole slice of the product is excluded
    reason: str
    count: int = 1  # combinations of the product this exclusion stands for


# -- built-in constraints ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    """A built-in rule: the combination keys it reads, and why a combination breaks it (or None)."""

    name: str
    keys: tuple[str, ...]
    check: Callable[[Mapping[str, Any], Matrix], str | None]


def _tp(combo: Mapping[str, Any]) -> int:
    return int(combo.get("tp", 1))


def _tp_fits_node(combo, matrix):
    gpu = matrix.gpus[combo["gpu"]]
    if _tp(combo) > gpu.count:
        return f"tp={_tp(combo)} needs more than the {gpu.count} GPU(s) per node of {gpu.name}"
    return None


def _weights_fit(combo, matrix):
    model, gpu = matrix.models[combo["model"]], matrix.gpus[combo["gpu"]]
    per_gpu = model.weights_gb / _tp(combo)
    if per_gpu > gpu.memory_gb * GPU_MEMORY_FRACTION:
        return (
            f"{model.name} weights {model.weights_gb:g} GB / tp={_tp(combo)} = {per_gpu:.1f} GB per GPU "
            f"do not fit {gpu.name}'s {gpu.memory_gb:g} GB x {GPU_MEMORY_FRACTION}"
        )
    return None


def _mtp_needs_head(combo, matrix):
    model = matrix.models[combo["model"]]
    if combo.get("mtp", 0) and not model.mtp_head:
        return f"mtp={combo['mtp']} on {model.name}, which has no MTP head"
    return None


def _expert_parallel_needs_moe(combo, matrix):
    model = matrix.models[combo["model"]]
    if combo.get("expert_parallel") and not model.moe:
        return f"expert_parallel on {model.name}, which is not a mixture-of-experts model"
    return None


_builders: dict[int, tuple[Mapping[str, Flag], ArgvBuilder]] = {}


def argv_builder(registry: Mapping[str, Flag]) -> ArgvBuilder:
    """One caching ArgvBuilder per registry object (planning builds argv for many cells)."""
    entry = _builders.get(id(registry))
    if entry is None or entry[0] is not registry:
        entry = _builders[id(registry)] = (registry, ArgvBuilder(registry))
    return entry[1]


def _argv_builds(combo, matrix):
    flags = {k: v for k, v in combo.items() if k not in CELL_KEYS}
    try:
        argv_builder(matrix.registry).build(flags)
    except ArgvConflict as exc:
        return f"conflicting flags: {exc}"
    return None


CONSTRAINTS: dict[str, Constraint] = {
    c.name: c
    for c in [
        Constraint("tp_fits_node", ("gpu", "tp"), _tp_fits_node),
        Constraint("weights_fit", ("model", "gpu", "tp"), _weights_fit),
        Constraint("mtp_needs_head", ("model", "mtp"), _mtp_needs_head),
        Constraint("expert_parallel_needs_moe", ("model", "expert_parallel"), _expert_parallel_needs_moe),
        Constraint("argv_builds", (), _argv_builds),
    ]
}


def violations(
    combo: Mapping[str, Any], matrix: Matrix, constraints: Mapping[str, Constraint] | None = None
) -> list[str]:
    return [reason for c in (constraints or CONSTRAINTS).values() if (reason := c.check(combo, matrix))]


_MISSING = object()


class Checker:
    """`violations` with each constraint's answer memoised on the keys it reads: a 12-axis product
    has hundreds of thousands of combinations but few distinct (model, gpu, tp) triples."""

    def __init__(self, matrix: Matrix, constraints: Mapping[str, Constraint] | None = None):
        self.matrix = matrix
        self.constraints = list((constraints or CONSTRAINTS).values())
        self.memo: list[dict] = [{} for _ in self.constraints]
        # a constraint over "all flags" (argv_builds) only depends on the JSON-valued ones
        self.keys = [c.keys or json_flag_names(matrix) for c in self.constraints]
        self.read_keys = {k for keys in self.keys for k in keys}

    def violations(self, combo: Mapping[str, Any]) -> list[str]:
        out = []
        for constraint, keys, memo in zip(self.constraints, self.keys, self.memo, strict=True):
            key = tuple((type(v), v) for v in (combo.get(k, _MISSING) for k in keys))
            reason = memo.get(key, _MISSING)
            if reason is _MISSING:
                reason = memo[key] = constraint.check(
                    {k: combo[k] for k in keys if k in combo} if not constraint.keys else combo, self.matrix
                )
            if reason:
                out.append(reason)
        return out


def json_flag_names(matrix: Matrix) -> tuple[str, ...]:
    """Flags of the matrix (axes and include entries) with a value that sets a JSON-valued option."""
    builder = argv_builder(matrix.registry)
    values: dict[str, set] = {}
    for name, vals in matrix.axes.items():
        values.setdefault(name, set()).update((type(v), v) for v in vals)
    for entry in matrix.include:
        for name, v in entry.items():
            if name not in CELL_KEYS:
                values.setdefault(name, set()).add((type(v), v))
    return tuple(sorted(name for name, vals in values.items() if any(builder.fragment(name, v).json for _, v in vals)))


# -- include / exclude (GitHub Actions semantics) ---------------------------------------------------


def rule_matches(rule: Mapping[str, Any], combo: Mapping[str, Any]) -> bool:
    """GitHub Actions' partial match: every key of the rule is in the combination with that value."""
    return all(k in combo and _same(combo[k], v) for k, v in rule.items())


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def apply_exclude(
    combos: Iterable[dict], exclude: Sequence[Mapping[str, Any]], excluded: list[Exclusion]
) -> Iterator[dict]:
    for combo in combos:
        hit = next((i for i, rule in enumerate(exclude) if rule_matches(rule, combo)), None)
        if hit is None:
            yield combo
        else:
            excluded.append(Exclusion(combo, f"exclude[{hit}]"))


def apply_include(combos: list[dict], include: Sequence[Mapping[str, Any]], original_keys: Iterable[str]) -> list[dict]:
    """Merge each include into every original combination whose original values it does not
    overwrite (values added by an earlier include may be overwritten); otherwise append it as a
    new combination. New combinations are never merged into."""
    original_keys = set(original_keys)
    originals = [dict(c) for c in combos]
    added: list[dict] = []
    for entry in include:
        matched = False
        for combo in originals:
            if all(k not in original_keys or k not in combo or _same(combo[k], v) for k, v in entry.items()):
                combo.update(entry)
                matched = True
        if not matched:
            added.append(dict(entry))
    return originals + added
