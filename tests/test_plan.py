"""Planning: include/exclude with GitHub Actions semantics, constraints with reasons, argv, cost."""

import itertools
import textwrap

import pytest

from soakmatrix.matrix.constraints import apply_exclude, apply_include
from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.spec import SpecError, load_matrix


def product(**axes):
    keys = list(axes)
    return [dict(zip(keys, v)) for v in itertools.product(*axes.values())]


# -- GitHub Actions documentation's own examples -----------------------------------------------------

def test_github_exclude_example_partial_match():
    combos = product(os=["macos-latest", "windows-latest"], version=[12, 14, 16],
                     environment=["staging", "production"])
    excluded = []
    kept = list(apply_exclude(combos, [{"os": "macos-latest", "version": 12, "environment": "production"},
                                       {"os": "windows-latest", "version": 16}], excluded))
    assert len(kept) == 9 and len(excluded) == 3
    assert {"os": "windows-latest", "version": 16, "environment": "staging"} not in kept
    assert {"os": "macos-latest", "version": 12, "environment": "staging"} in kept


def test_github_include_example_fruit_animal():
    combos = product(fruit=["apple", "pear"], animal=["cat", "dog"])
    include = [{"color": "green"}, {"color": "pink", "animal": "cat"}, {"fruit": "apple", "shape": "circle"},
               {"fruit": "banana"}, {"fruit": "banana", "animal": "cat"}]
    result = apply_include(combos, include, ["fruit", "animal"])
    assert result == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]


def test_github_include_example_adds_key_to_matching_combination():
    combos = product(os=["windows-latest", "ubuntu-latest"], node=[14, 16])
    result = apply_include(combos, [{"os": "windows-latest", "node": 16, "npm": 6}], ["os", "node"])
    assert {"os": "windows-latest", "node": 16, "npm": 6} in result
    assert {"os": "windows-latest", "node": 14} in result
    assert len(result) == 4


def test_github_include_example_new_combination_when_it_would_overwrite():
    combos = product(os=["windows-latest", "ubuntu-latest", "macos-latest"], version=[10, 12, 14])
    result = apply_include(combos, [{"os": "windows-latest", "version": 17}], ["os", "version"])
    assert len(result) == 10 and result[-1] == {"os": "windows-latest", "version": 17}


# -- matrices ---------------------------------------------------------------------------------------

BASE = textwrap.dedent("""\
    models:
      big: {path: org/big, weights_gb: 700, mtp_head: true, moe: true}
      small: {path: org/small, weights_gb: 8}
    gpus:
      H200: {count: 8, memory_gb: 141}
      RTX5090: {count: 1, memory_gb: 32, ray_label: GeForce-RTX-5090}
    axes:
      tp: [1, 8]
      mtp: [0, 1]
    profiles:
      p: {soak: 1h, startup: 10m}
""")


def matrix(extra="", base=BASE):
    return load_matrix("m.yaml", text=base + extra)


def test_constraints_keep_their_reasons():
    result = plan(matrix())
    names = {pc.name for pc in result.cells}
    assert "big|H200|mtp=1,tp=8|random" in names
    assert "small|RTX5090|mtp=0,tp=1|random" in names
    reasons = [e.reason for e in result.excluded]
    assert any("tp=8 needs more than the 1 GPU(s) per node of RTX5090" in r for r in reasons)
    assert any("do not fit H200" in r for r in reasons)          # big at tp=1
    assert any("which has no MTP head" in r for r in reasons)    # small with mtp=1
    for e in result.excluded:
        assert e.reason and set(e.combo) >= {"model", "gpu", "tp", "mtp"}
    assert len(result.cells) + result.excluded_count == result.product_size == 16


def test_cost_counts_tp_gpus_for_startup_plus_soak():
    result = plan(matrix())
    cell = next(pc for pc in result.cells if pc.name == "big|H200|mtp=1,tp=8|random")
    assert cell.gpu_count == 8
    assert cell.gpu_hours == pytest.approx(8 * (3600 + 600) / 3600)
    cost = result.cost_by_gpu()
    assert cost["H200"]["gpu_hours"] == pytest.approx(sum(pc.gpu_hours for pc in result.cells
                                                          if pc.cell.gpu == "H200"))
    assert result.to_json()["cost"]["gpu_hours"] == pytest.approx(result.gpu_hours, abs=1e-3)


def test_exclude_then_include_adds_back():
    extra = textwrap.dedent("""\
        exclude:
          - {model: small}
        include:
          - {model: small, gpu: RTX5090, tp: 1, mtp: 0, max_num_seqs: 8}
    """)
    names = [pc.name for pc in plan(matrix(extra)).cells]
    assert "small|RTX5090|max_num_seqs=8,mtp=0,tp=1|random" in names
    assert not any(n.startswith("small|H200") for n in names)


def test_include_merges_extra_flag_into_matching_cells():
    extra = "include:\n  - {model: big, mtp: 1, flashinfer_autotune: false}\n"
    result = plan(matrix(extra))
    big_mtp = [pc for pc in result.cells if pc.cell.model == "big" and pc.cell.flag_dict["mtp"] == 1]
    assert big_mtp and all(pc.cell.flag_dict["flashinfer_autotune"] is False for pc in big_mtp)
    assert "--no-enable-flashinfer-autotune" in big_mtp[0].serve_args


def test_include_without_model_is_reported_with_its_line():
    extra = "include:\n  - {gpu: H200, tp: 4}\n"
    with pytest.raises(SpecError) as info:
        plan(matrix(extra))
    (problem,) = info.value.problems
    assert problem.line == BASE.count("\n") + 2 and "without model" in problem.message


def test_argv_includes_model_args_and_json_flags():
    base = BASE.replace("weights_gb: 700, mtp_head: true", "weights_gb: 700, mtp_head: true, args: [--max-model-len, '4096']")
    extra = "  cudagraph_mode: [FULL_DECODE_ONLY]\n"
    text = base.replace("  mtp: [0, 1]\n", "  mtp: [0, 1]\n" + extra)
    result = plan(load_matrix("m.yaml", text=text))
    pc = next(pc for pc in result.cells if pc.name.startswith("big|H200|cudagraph_mode=FULL_DECODE_ONLY,mtp=1"))
    assert pc.command[:5] == ["vllm", "serve", "org/big", "--max-model-len", "4096"]
    assert pc.command.count("--compilation-config") == 1
    assert '{"method": "mtp", "num_speculative_tokens": 1}' in pc.command


def test_conflicting_json_flags_are_excluded_with_reason():
    text = BASE.replace("  mtp: [0, 1]\n", "  mtp: [0, 1]\n  ngram: [0, 2]\n")
    result = plan(load_matrix("m.yaml", text=text))
    assert any("conflicting flags" in e.reason for e in result.excluded)
    assert all(not (pc.cell.flag_dict["mtp"] and pc.cell.flag_dict["ngram"]) for pc in result.cells)


def test_validation_rejections_are_reported_with_vllms_message():
    def fake_vllm(cells):
        return "checked", {pc.id: "argument --max-num-seqs: invalid int value" for pc in cells if pc.cell.tp == 8}

    result = plan(matrix(), validate=fake_vllm)
    assert result.rejected and all(pc.cell.tp == 1 for pc in result.cells)
    assert result.rejected[0].reason == "argument --max-num-seqs: invalid int value"
    assert result.validation == "checked"


def test_over_budget_is_flagged():
    text = BASE.replace("p: {soak: 1h, startup: 10m}", "p: {soak: 1h, startup: 10m, budget_gpu_hours: 1}")
    result = plan(load_matrix("m.yaml", text=text))
    assert result.over_budget and result.to_json()["cost"]["over_budget"] is True


def test_profile_restricts_models_and_gpus():
    text = BASE.replace("p: {soak: 1h, startup: 10m}", "p: {soak: 1h, models: [small], gpus: [RTX5090]}")
    result = plan(load_matrix("m.yaml", text=text))
    assert {(pc.cell.model, pc.cell.gpu) for pc in result.cells} == {("small", "RTX5090")}


def test_plan_is_deterministic(examples):
    m = load_matrix(examples / "nightly.yaml")
    a, b = plan(m), plan(m)
    assert [pc.id for pc in a.cells] == [pc.id for pc in b.cells]
