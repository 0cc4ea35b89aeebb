"""t-way coverage: every t-tuple the constraints allow appears, and the array is small."""

import itertools
import textwrap

import pytest

from soakmatrix.matrix.constraints import rule_matches, violations
from soakmatrix.matrix.coverage import covering_array, uncovered_tuples
from soakmatrix.matrix.plan import factors_of, plan
from soakmatrix.matrix.spec import load_matrix

TEXT = textwrap.dedent("""\
    models:
      big: {path: org/big, weights_gb: 700, mtp_head: true, moe: true}
      mid: {path: org/mid, weights_gb: 60, mtp_head: true}
      small: {path: org/small, weights_gb: 8}
    gpus:
      H200: {count: 8, memory_gb: 141}
      H20: {count: 8, memory_gb: 96}
      RTX5090: {count: 1, memory_gb: 32}
    axes:
      tp: [1, 2, 8]
      mtp: [0, 1, 2]
      async_scheduling: [true, false]
      cudagraph_mode: [FULL_AND_PIECEWISE, FULL_DECODE_ONLY, PIECEWISE]
      flashinfer_autotune: [true, false]
      expert_parallel: [false, true]
    exclude:
      - {gpu: H20, cudagraph_mode: PIECEWISE}
    profiles:
      pairwise: {coverage: {t: 2}}
      threeway: {coverage: {t: 3}}
      full: {coverage: full}
""")


@pytest.fixture(scope="module")
def m():
    return load_matrix("cov.yaml", text=TEXT)


def allowed_in(m):
    return lambda combo: not any(rule_matches(r, combo) for r in m.exclude) and not violations(combo, m)


def combos_of(result):
    return [{"model": pc.cell.model, "gpu": pc.cell.gpu, "workload": pc.cell.workload, **pc.cell.flag_dict}
            for pc in result.cells]


@pytest.mark.parametrize("profile,t", [("pairwise", 2), ("threeway", 3)])
def test_every_allowed_t_tuple_is_covered(m, profile, t):
    result = plan(m, profile)
    factors = factors_of(m, m.profile(profile))
    rows = combos_of(result)
    assert uncovered_tuples(rows, factors, t, allowed_in(m)) == []
    # and no row breaks a constraint or an exclusion
    assert all(allowed_in(m)(row) for row in rows)


def test_t_way_is_much_smaller_than_the_full_product(m):
    full = plan(m, "full")
    pairwise = plan(m, "pairwise")
    assert len(pairwise.cells) < len(full.cells) / 5
    assert pairwise.coverage == "2-way" and pairwise.product_size == full.product_size


def test_pairwise_size_near_best_known():
    # eight parameters of 2,4,3,2,4,2,2,2 values: 16 rows is the best known
    factors = {f"p{i}": list(range(n)) for i, n in enumerate([2, 4, 3, 2, 4, 2, 2, 2])}
    rows = covering_array(factors, 2, lambda combo: True)
    assert uncovered_tuples(rows, factors, 2, lambda combo: True) == []
    assert len(rows) <= 18


def test_bool_and_int_values_do_not_collide():
    factors = {"a": [True, 1, False, 0], "b": ["x", "y"]}
    rows = covering_array(factors, 2, lambda combo: True)
    seen = {(type(r["a"]), r["a"], r["b"]) for r in rows}
    assert len(seen) == 8


def test_one_way_covers_each_value():
    factors = {"a": [1, 2, 3], "b": ["x", "y"], "c": [True, False]}
    rows = covering_array(factors, 1, lambda combo: not (combo["a"] == 3 and combo["b"] == "x"))
    for key, values in factors.items():
        assert {r[key] for r in rows} == set(values)
    assert all(not (r["a"] == 3 and r["b"] == "x") for r in rows)
    assert len(rows) <= 3


def test_uncovered_tuples_finds_a_missing_pair():
    factors = {"a": [0, 1], "b": [0, 1]}
    rows = [dict(zip("ab", c)) for c in itertools.product([0, 1], [0, 1])][:-1]
    assert uncovered_tuples(rows, factors, 2, lambda combo: True) == [(("a", "1"), ("b", "1"))]
