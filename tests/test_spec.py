"""The matrix loader: every error at once, each with file, line and key."""

import textwrap

import pytest

from soakmatrix.matrix.contracts.durations import format_duration, parse_duration
from soakmatrix.matrix.spec import SpecError, load_matrix

GOOD = textwrap.dedent("""\
    name: t
    models:
      m: {path: org/m, weights_gb: 10, mtp_head: true}
    gpus:
      H200: {count: 8, memory_gb: 141}
    axes:
      mtp: [0, 1]
      tp: [1, 2]
    workloads:
      w: {kind: random, concurrency: 4}
    profiles:
      p: {coverage: full, soak: 10m, workloads: [w], budget_gpu_hours: 5}
    baseline: {mtp: 0, tp: 1}
""")


def load(text, name="m.yaml"):
    return load_matrix(name, text=text)


def problems(text):
    with pytest.raises(SpecError) as info:
        load(text)
    return info.value.problems


def test_good_file_loads_into_frozen_dataclasses():
    m = load(GOOD)
    assert m.models["m"].mtp_head is True
    assert m.gpus["H200"].ray_label == "H200"
    assert m.axes == {"mtp": (0, 1), "tp": (1, 2)}
    p = m.profile("p")
    assert p.soak_s == 600 and p.coverage is None and p.workloads == ("w",)
    assert m.workloads["w"].params["concurrency"] == 4
    assert m.workloads["w"].params["loop"] == "closed"   # defaults filled in
    with pytest.raises(Exception):
        m.models["m"].path = "x"


def test_every_error_is_reported_at_once_with_lines():
    text = textwrap.dedent("""\
        name: t
        modles: {}
        models:
          m: {path: org/m, weights_gb: -3}
        gpus:
          H200: {count: 0, memory_gb: 141}
        axes:
          mtp: [0, -1]
          turbo: [true]
          tp: []
          cudagraph_mode: [FULL, SOMETIMES]
        exclude:
          - {gpu: B300, mtp: 1}
        profiles:
          p: {coverage: {t: 9}, soak: forever}
        baseline: {async_scheduling: maybe}
    """)
    found = {(p.line, p.key): p.message for p in problems(text)}
    keys = {k for _, k in found}
    assert (2, "modles") in found and "unknown key" in found[(2, "modles")]
    assert (4, "models.m.weights_gb") in found
    assert (6, "gpus.H200.count") in found
    assert (8, "axes.mtp[1]") in found and ">= 0" in found[(8, "axes.mtp[1]")]
    assert (9, "axes.turbo") in found and "unknown flag" in found[(9, "axes.turbo")]
    assert (10, "axes.tp") in found and "at least one value" in found[(10, "axes.tp")]
    assert (11, "axes.cudagraph_mode[1]") in found
    assert (13, "exclude[0].gpu") in found and "unknown GPU type 'B300'" in found[(13, "exclude[0].gpu")]
    assert "profiles.p.coverage" in keys and "profiles.p.soak" in keys
    assert (16, "baseline.async_scheduling") in found


def test_error_message_names_file_line_and_key():
    text = GOOD.replace("mtp: [0, 1]", "mtpp: [0, 1]")
    with pytest.raises(SpecError) as info:
        load(text, "nightly.yaml")
    assert str(info.value).startswith("nightly.yaml:7: axes.mtpp: unknown flag 'mtpp'")


def test_invalid_yaml_names_the_line():
    (p,) = problems("models:\n  m: {path: x\n")
    assert p.line >= 2 and "invalid YAML" in p.message


def test_duplicate_keys_are_errors():
    text = GOOD.replace("  tp: [1, 2]\n", "  tp: [1, 2]\n  tp: [4]\n")
    assert any(p.key == "axes.tp" and "duplicate" in p.message for p in problems(text))


def test_unknown_workload_param_and_kind():
    text = GOOD.replace("w: {kind: random, concurrency: 4}", "w: {kind: random, concurency: 4}\n  v: {kind: fuzz}")
    found = {p.key: p.message for p in problems(text)}
    assert "unknown parameter" in found["workloads.w.concurency"]
    assert "unknown workload kind 'fuzz'" in found["workloads.v.kind"]


def test_an_entry_with_errors_is_reported_where_it_is_declared_not_again_where_it_is_used():
    """A workload or GPU type that did not load is not also "unknown" in the profile or exclude that
    names it (the user would look for a typo that is not there); a name declared nowhere still is."""
    text = (GOOD.replace("concurrency: 4", "concurrency: -3")
            .replace("H200: {count: 8, memory_gb: 141}", "H200: {count: 0, memory_gb: 141}")
            + "exclude:\n  - {gpu: H200, mtp: 1}\n  - {gpu: B200, mtp: 1}\n")
    found = [(p.key, p.message) for p in problems(text)]
    keys = [key for key, _ in found]
    assert "workloads.w.concurrency" in keys and "gpus.H200.count" in keys
    assert "profiles.p.workloads[0]" not in keys and "exclude[0].gpu" not in keys, found
    assert any(key == "exclude[1].gpu" and "unknown GPU type 'B200'" in message for key, message in found)


def test_custom_raw_args_flag_extends_the_registry():
    text = GOOD + textwrap.dedent("""\
        flags:
          block_size: {type: int, argv: [--block-size, "{value}"]}
    """)
    text = text.replace("  tp: [1, 2]\n", "  tp: [1, 2]\n  block_size: [16, 256]\n")
    m = load(text)
    assert m.axes["block_size"] == (16, 256)
    assert "block_size" in m.registry
    from soakmatrix.matrix.contracts.flags import REGISTRY
    assert "block_size" not in REGISTRY   # the global registry is untouched


def test_custom_flag_cannot_redefine_builtin():
    text = GOOD + "flags:\n  tp: {type: int, argv: [--tp, '{value}']}\n"
    assert any(p.key == "flags.tp" for p in problems(text))


def test_missing_sim_hang_model_file(tmp_path):
    text = GOOD + "sim: {hang_model: nowhere.yaml}\n"
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="no such file"):
        load_matrix(path)


def test_unknown_profile_is_a_spec_error():
    with pytest.raises(SpecError, match="no profile 'nightly'"):
        load(GOOD).profile("nightly")


def test_unreadable_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_matrix(tmp_path / "absent.yaml")


@pytest.mark.parametrize("text,seconds", [("90", 90), (90, 90), ("90s", 90), ("10m", 600), ("2h", 7200),
                                          ("1h30m", 5400), ("1d", 86400), (2.5, 2.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["forever", "", "-1s", True, -3])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_duration():
    assert format_duration(7200) == "2h"
    assert format_duration(2280) == "38m"
    assert format_duration(18720) == "5h12m"
    assert format_duration(45) == "45s"


def test_examples_load(examples):
    for name in ["demo", "nightly", "smoke"]:
        m = load_matrix(examples / f"{name}.yaml")
        assert m.baseline and m.profiles
