"""The bisection report as a person reads it: the minimal set's line states the confidence it was
decided at, and never offers a search-model posterior that does not apply as if it did."""

from __future__ import annotations

import pytest
from tests.test_bisect import MTTF, DeterministicOracle, Settings, bisect, elements, failing, planted, run_virtual

from soakmatrix.matrix.bisect.report import render_text, to_json
from soakmatrix.matrix.contracts.hangmodel import Modifier


def minimal_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("minimal set:")]
    return line


def test_a_plain_answer_shows_the_search_models_posterior():
    result = bisect(failing(6), elements(6), DeterministicOracle({"f1", "f4"}), Settings(confidence=0.99),
                    gpu_count=lambda f: 1)
    line = minimal_line(render_text(result))
    assert "f1=true, f4=true" in line and "stated confidence 0.99" in line
    assert f"posterior under the one-rate search model {result.posterior:.4f}" in line
    assert result.posterior >= 0.99 and result.rate_added == []


def test_a_set_the_rate_check_grew_says_why_the_search_models_posterior_does_not_apply():
    # an x8 modifier under an explicit cap (3 x the MTTF) joins the set; the one-rate search model,
    # which holds a shared rate for every config with the set, cannot account for it
    model = planted(8, ["f1", "f6"], MTTF, modifiers=[Modifier({"f4": (False,)}, 8.0)])
    for seed in range(12):
        result = run_virtual(model, 8, seed, Settings(confidence=0.99, mttf_cap_s=3 * MTTF))
        if result.status == "found" and result.posterior < 0.99:
            break
    else:
        raise AssertionError("no run where the rate check grew the set past the search model")
    assert set(result.minimal) == {"f1", "f4", "f6"}
    line = minimal_line(render_text(result))
    assert "stated confidence 0.99" in line
    assert result.rate_added == ["f4"]
    assert "does not apply: the rate check found that f4 changes the rate" in line
    assert "posterior under the one-rate search model" not in line
    # the JSON keeps the number for tools, with the notes that explain it
    doc = to_json(result)
    assert doc["posterior"] == pytest.approx(result.posterior, abs=1e-3)
    assert doc["rate_added"] == ["f4"]
    assert any("f4 is needed to hang within the cap" in n for n in doc["notes"])
