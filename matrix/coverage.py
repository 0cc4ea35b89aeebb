"""t-way covering arrays that respect the matrix's exclusions and constraints, built by covertable.

Values are handed to covertable as indices (so `True` and `1` never collide) and every exclude
rule and built-in constraint becomes a covertable `fn` constraint over just the keys it reads, so
partial rows are pruned as early as possible. Pure: the matrix and constraints are inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from covertable import Controller

from .constraints import CONSTRAINTS, rule_matches
from .spec import CELL_KEYS, Matrix


def covering_array(
    factors: Mapping[str, Sequence[Any]],
    strength: int,
    allowed: Callable[[Mapping[str, Any]], bool],
    matrix: Matrix | None = None,
) -> list[dict]:
    """Rows covering every allowed t-tuple of factor values, as dicts of real values."""
    keys = list(factors)
    if not keys:
        return []
    strength = max(1, min(strength, len(keys)))
    values = {k: list(v) for k, v in factors.items()}
    if len(keys) == 1:
        return [{keys[0]: v} for v in values[keys[0]] if allowed({keys[0]: v})]
    index_factors = {k: list(range(len(v))) for k, v in values.items()}

    def decode(row: Mapping[str, int]) -> dict:
        return {k: values[k][i] for k, i in row.items() if k in values}

    constraints = [_fn(keys_read, values, check) for keys_read, check in _checks(keys, matrix, allowed)]
    controller = Controller(index_factors, strength=strength, constraints=constraints or None)
    rows = [decode(r) for r in controller.make()]
    return [{k: row[k] for k in keys} for row in rows if len(row) == len(keys) and allowed(row)]


def _fn(
    keys_read: Sequence[str], values: Mapping[str, Sequence[Any]], check: Callable[[Mapping[str, Any]], bool]
) -> dict:
    def evaluate(row: Mapping[str, int]) -> bool:
        return check({k: values[k][row[k]] for k in keys_read})

    return {"operator": "fn", "requires": list(keys_read), "evaluate": evaluate}


def _checks(
    keys: Sequence[str], matrix: Matrix | None, allowed: Callable[[Mapping[str, Any]], bool]
) -> list[tuple[tuple[str, ...], Callable]]:
    """(keys read, predicate) pairs: as fine-grained as the matrix allows, else one over all keys."""
    if matrix is None:
        return [(tuple(keys), allowed)]
    out: list[tuple[tuple[str, ...], Callable]] = []
    for rule in matrix.exclude:
        read = tuple(k for k in rule if k in keys)
        if len(read) == len(rule):  # a rule over a non-factor key can never match a row
            out.append((read, lambda combo, rule=rule: not rule_matches(rule, combo)))
    flag_keys = tuple(k for k in keys if k not in CELL_KEYS)
    for constraint in CONSTRAINTS.values():
        needs = constraint.keys or flag_keys
        required_cell_keys = [k for k in needs if k in CELL_KEYS]
        read = tuple(k for k in needs if k in keys)
        if any(k not in keys for k in required_cell_keys) or not read:
            continue
        out.append((read, lambda combo, c=constraint: c.check(combo, matrix) is None))
    return out


def uncovered_tuples(
    rows: Sequence[Mapping[str, Any]],
    factors: Mapping[str, Sequence[Any]],
    strength: int,
    allowed: Callable[[Mapping[str, Any]], bool],
) -> list[tuple]:
    """Every t-tuple that some allowed full combination has but no row has (a check, exponential)."""
    keys = list(factors)
    feasible: set[tuple] = set()
    for combo in itertools.product(*factors.values()):
        row = dict(zip(keys, combo, strict=True))
        if allowed(row):
            for ks in itertools.combinations(keys, strength):
                feasible.add(tuple((k, repr(row[k])) for k in ks))
    covered: set[tuple] = set()
    for given in rows:
        for ks in itertools.combinations(keys, strength):
            covered.add(tuple((k, repr(given[k])) for k in ks))
    return sorted(feasible - covered)
