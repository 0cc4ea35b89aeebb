"""Smoke selection: changed files -> flags -> cells, informative order, budget trimming."""

import itertools

import pytest

from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.smoke_selection import (
    cells_touching,
    deviations,
    glob_matches,
    informative_order,
    interactions,
    read_changed_files,
    touched_flags,
    trim_to_budget,
)
from soakmatrix.matrix.spec import load_matrix


@pytest.fixture(scope="module")
def smoke(request):
    from tests.conftest import EXAMPLES
    matrix = load_matrix(EXAMPLES / "smoke.yaml")
    return matrix, plan(matrix, "smoke").cells


def test_read_changed_files_skips_blanks_and_comments():
    text = "vllm/a.py\n\n# note\n  ./vllm/b.py  \n"
    assert read_changed_files(text) == ["vllm/a.py", "vllm/b.py"]


@pytest.mark.parametrize("pattern,path,expected", [
    ("vllm/v1/spec_decode/**", "vllm/v1/spec_decode/eagle.py", True),
    ("vllm/v1/spec_decode/**", "vllm/v1/spec_decode/sub/x.py", True),
    ("vllm/v1/spec_decode/**", "vllm/v1/worker/x.py", False),
    ("vllm/v1/core/kv_cache_*", "vllm/v1/core/kv_cache_utils.py", True),
    ("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu_model_runner.py", True),
    ("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu_model_runner.pyc", False),
    ("vllm/compilation/", "vllm/compilation/backends.py", True),
    ("vllm/**/flashinfer.py", "vllm/flashinfer.py", True),
    ("vllm/**/flashinfer.py", "vllm/v1/attention/backends/flashinfer.py", True),
])
def test_glob_matches(pattern, path, expected):
    assert glob_matches(pattern, path) is expected


def test_touched_flags_maps_files_through_source_dependencies(smoke):
    matrix, _ = smoke
    touched = touched_flags(["vllm/v1/spec_decode/eagle.py", "docs/index.md",
                             "vllm/v1/worker/gpu_model_runner.py"], matrix.source_dependencies)
    assert set(touched) == {"mtp", "cudagraph_mode", "async_scheduling"}
    assert touched["mtp"] == ["vllm/v1/spec_decode/eagle.py", "vllm/v1/worker/gpu_model_runner.py"]
    assert touched_flags(["README.md"], matrix.source_dependencies) == {}


def test_cells_touching_keeps_only_cells_off_baseline_in_a_touched_flag(smoke):
    matrix, cells = smoke
    picked = cells_touching(cells, ["mtp"], matrix.baseline)
    assert picked and len(picked) < len(cells)
    assert all(pc.cell.flag_dict["mtp"] != matrix.baseline["mtp"] for pc in picked)
    assert all(pc in picked for pc in cells if pc.cell.flag_dict.get("mtp") == 1)


def test_informative_order_covers_every_pair_as_early_as_greedy_allows(smoke):
    matrix, cells = smoke
    ordered = informative_order(cells, 2, matrix.baseline)
    assert sorted(pc.id for pc in ordered) == sorted(pc.id for pc in cells)
    all_pairs = set().union(*(interactions(pc, 2) for pc in cells))
    covered, first_full = set(), None
    for i, pc in enumerate(ordered, 1):
        covered |= interactions(pc, 2)
        if covered == all_pairs and first_full is None:
            first_full = i
    assert first_full is not None and first_full <= len(ordered)
    # the first cell covers at least as many pairs per GPU-hour as any other
    rate = lambda pc: len(interactions(pc, 2)) / pc.gpu_hours  # noqa: E731
    assert rate(ordered[0]) == max(rate(pc) for pc in cells)
    # with half the GPU-hours, the greedy order has covered more pairs than the plan's own order
    half = sum(pc.gpu_hours for pc in cells) / 2
    greedy = set().union(*(interactions(pc, 2) for pc in trim_to_budget(ordered, half).kept))
    planned = set().union(*(interactions(pc, 2) for pc in trim_to_budget(cells, half).kept))
    assert len(greedy) > len(planned)


def test_informative_order_is_reproducible(smoke):
    matrix, cells = smoke
    assert [pc.id for pc in informative_order(cells, 2, matrix.baseline)] == \
        [pc.id for pc in informative_order(list(reversed(cells)), 2, matrix.baseline)]


def test_informative_order_breaks_ties_towards_the_touched_flags():
    text = """
models: {m: {path: m, mtp_head: true}}
gpus: {H200: {count: 8, memory_gb: 141}}
axes: {mtp: [0, 1], async_scheduling: [true, false]}
profiles: {p: {soak: 1m, startup: 1m}}
baseline: {mtp: 0, async_scheduling: false}
"""
    matrix = load_matrix("inline.yaml", text)
    cells = plan(matrix, "p").cells
    # (mtp=1, async=false) and (mtp=0, async=true) tie on pairs and cost
    first = {f: informative_order(cells, 1, matrix.baseline, focus={f})[0] for f in ("mtp", "async_scheduling")}
    assert deviations(first["mtp"], matrix.baseline) >= {"mtp"}
    assert deviations(first["async_scheduling"], matrix.baseline) >= {"async_scheduling"}


def test_trim_to_budget_keeps_order_and_fills_with_cheaper_cells(smoke):
    _, cells = smoke
    ordered = sorted(cells, key=lambda pc: -pc.gpu_hours)
    budget = ordered[0].gpu_hours + ordered[-1].gpu_hours * 2 + 1e-6
    trimmed = trim_to_budget(ordered, budget)
    assert trimmed.gpu_hours <= budget
    assert trimmed.kept[0] is ordered[0]
    assert len(trimmed.kept) + len(trimmed.dropped) == len(ordered)
    assert [pc.id for pc in trimmed.kept] == [pc.id for pc in ordered if pc in trimmed.kept]
    # nothing dropped would still have fitted
    assert all(trimmed.gpu_hours + pc.gpu_hours > budget for pc in trimmed.dropped)
    assert trim_to_budget(ordered, None).kept == list(ordered)


def test_trim_to_budget_smaller_budget_never_keeps_more(smoke):
    _, cells = smoke
    sizes = [len(trim_to_budget(cells, b).kept) for b in (1, 5, 10, 40, 1000)]
    assert sizes == sorted(sizes)
    assert all(a <= b for a, b in itertools.pairwise(sizes))
