"""The hang-model file: loading with line-numbered errors, matching and modifiers."""

import textwrap

import pytest

from soakmatrix.matrix.contracts.hangmodel import load_hang_model
from soakmatrix.matrix.contracts.yamlsrc import SpecError

DESIGN_EXAMPLE = textwrap.dedent("""\
    seed: 7
    hangs:
      - id: mtp-cudagraph
        style: shm_broadcast
        when:
          mtp: [1, 2]
          cudagraph_mode: FULL_AND_PIECEWISE
        gpu: [H20, H200]
        min_running: 2
        mttf_s: 2280
        modifiers:
          - when: {flashinfer_autotune: false}
            mttf_factor: 8
""")


def test_design_example_loads():
    model = load_hang_model("h.yaml", text=DESIGN_EXAMPLE)
    (hang,) = model.hangs
    assert model.seed == 7
    assert hang.when == {"mtp": (1, 2), "cudagraph_mode": ("FULL_AND_PIECEWISE",)}
    assert hang.gpu == ("H20", "H200") and hang.min_running == 2


def test_matching_fills_vllm_defaults():
    model = load_hang_model("h.yaml", text=DESIGN_EXAMPLE)
    # cudagraph_mode absent: vLLM's default FULL_AND_PIECEWISE applies
    assert model.active({"mtp": 1, "tp": 8}, "H200")
    assert not model.active({"mtp": 1, "cudagraph_mode": "FULL_DECODE_ONLY"}, "H200")
    assert not model.active({"mtp": 0}, "H200")
    assert not model.active({"mtp": 2}, "RTX5090")


def test_modifier_scales_mttf():
    (hang,) = load_hang_model("h.yaml", text=DESIGN_EXAMPLE).hangs
    assert hang.effective_mttf_s({"mtp": 2, "flashinfer_autotune": True}) == 2280
    assert hang.effective_mttf_s({"mtp": 2, "flashinfer_autotune": False}) == 2280 * 8


def test_when_value_must_match():
    text = "hangs:\n  - {id: a, style: crash, when: {max_num_seqs: 1}, mttf_s: 5}\n"
    model = load_hang_model("h.yaml", text=text)
    assert model.active({"max_num_seqs": 1})
    assert not model.active({"max_num_seqs": 2})


def test_errors_are_collected_with_lines():
    text = textwrap.dedent("""\
        seed: x
        hangs:
          - id: a
            style: melt
            when: {mtpp: 1}
            mttf_s: 0
          - id: a
            style: crash
            when: {cudagraph_mode: SOMETIMES}
            mttf_s: 10
            modifiers: [{when: {tp: 2}, mttf_factor: -1, extra: 1}]
    """)
    with pytest.raises(SpecError) as info:
        load_hang_model("h.yaml", text=text)
    found = {(p.line, p.key) for p in info.value.problems}
    assert (1, "seed") in found
    assert (4, "hangs[0].style") in found
    assert (5, "hangs[0].when.mtpp") in found
    assert (6, "hangs[0].mttf_s") in found
    assert (9, "hangs[1].when.cudagraph_mode") in found
    assert (11, "hangs[1].modifiers[0].mttf_factor") in found
    assert (11, "hangs[1].modifiers[0].extra") in found


def test_example_hang_model_loads(examples):
    model = load_hang_model(examples / "hangs" / "demo.yaml")
    assert {h.style for h in model.hangs} <= {"silent_stall", "event_sync_stall", "shm_broadcast", "crash"}
