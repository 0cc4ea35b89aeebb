"""Engine builds in the matrix (issue 21 item 1): the `builds:` section, cells per build, the
runtime_env each kind becomes, hang models keyed on the build, and a build Ray cannot set up."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from soakmatrix.jobs.sim.args import SimUsageError, parse_sim_argv
from soakmatrix.jobs.sim.hangs import arm
from soakmatrix.matrix.builds import BUILD_ENV, BUILD_ORDINAL_ENV, runtime_env_for, setup_error_outcome
from soakmatrix.matrix.contracts.hangmodel import load_hang_model
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.schedule.runtime_envs import (
    interpreter_of,
    interpreter_present,
    runtime_env_option,
    setup_failure_result,
)
from soakmatrix.matrix.soak_specs import soak_spec_for
from soakmatrix.matrix.spec import Build, SpecError, load_matrix

BASE = textwrap.dedent("""\
    name: b
    models: {m: {path: org/m}}
    gpus: {H200: {count: 2, memory_gb: 141}}
    axes: {async_scheduling: [true, false]}
""")

BUILDS = BASE + textwrap.dedent("""\
    builds:
      v0.11.0: {pip: "vllm==0.11.0"}
      sha: {pip: "vllm @ git+https://github.com/vllm-project/vllm@abc123", setup_timeout: 20m}
      img: {image: "vllm/vllm-openai:v0.11.0"}
      local: {python: /opt/vllm/bin/python}
""")


def load(text, name="m.yaml"):
    return load_matrix(name, text=text)


def problems(text):
    with pytest.raises(SpecError) as info:
        load(text)
    return [str(p) for p in info.value.problems]


def test_builds_load_in_file_order_with_ordinals():
    m = load(BUILDS)
    assert list(m.builds) == ["v0.11.0", "sha", "img", "local"]
    assert [b.ordinal for b in m.builds.values()] == [0, 1, 2, 3]
    assert m.builds["sha"] == Build("sha", 1, "pip", "vllm @ git+https://github.com/vllm-project/vllm@abc123", 1200.0)
    assert m.builds["img"].kind == "image" and m.builds["local"].kind == "python"


def test_every_build_problem_is_reported_at_once_with_lines():
    text = BASE + textwrap.dedent("""\
        builds:
          a: {pip: "vllm==0.11.0", image: x}
          b: {}
          c: {python: bin/python}
          d: {pip: ""}
          e: {pip: vllm, setup_timeout: soon, colour: red}
        profiles: {p: {builds: [a, nope]}}
    """)
    found = problems(text)
    assert "m.yaml:6: builds.a: needs exactly one of pip, image, python, got pip, image" in found
    assert "m.yaml:7: builds.b: needs exactly one of pip, image, python" in found
    assert any(p.startswith("m.yaml:8: builds.c.python: expected an absolute path") for p in found)
    assert any(p.startswith("m.yaml:9: builds.d.pip: expected a non-empty string") for p in found)
    assert any(p.startswith("m.yaml:10: builds.e.setup_timeout:") for p in found)
    assert any(p.startswith("m.yaml:10: builds.e.colour: unknown key") for p in found)
    assert any("m.yaml:11: profiles.p.builds[1]: unknown build 'nope'" in p for p in found)


def test_an_empty_builds_section_is_an_error():
    assert any("builds: empty" in p for p in problems(BASE + "builds: {}\n"))


def test_every_cell_runs_on_every_build_and_the_build_is_in_its_id_and_name():
    m = load(BUILDS)
    without = plan(load(BASE))
    result = plan(m)
    assert len(result.cells) == 2 * 4
    assert [pc.cell.build for pc in result.cells[:4]] == ["v0.11.0", "sha", "img", "local"]
    names = [pc.name for pc in result.cells]
    assert names[0] == "m|H200|async_scheduling=true|random|v0.11.0"
    assert len(set(pc.id for pc in result.cells)) == 8
    # a matrix without builds keeps its ids and names
    assert {pc.id for pc in without.cells}.isdisjoint(pc.id for pc in result.cells)
    assert without.cells[0].name == "m|H200|async_scheduling=true|random"
    doc = result.to_json()
    assert [b["name"] for b in doc["builds"]] == list(m.builds)
    assert doc["cells"][1]["build"] == "sha"
    assert "builds" not in without.to_json() and "build" not in without.to_json()["cells"][0]


def test_a_profile_runs_the_builds_it_names_in_history_order():
    m = load(BUILDS + "profiles: {nightly: {builds: [local, v0.11.0]}}\n")
    assert [pc.cell.build for pc in plan(m).cells[:2]] == ["v0.11.0", "local"]


@pytest.mark.parametrize("kind, value, expected", [
    ("pip", "vllm==0.11.0", {"pip": {"packages": ["vllm==0.11.0"], "pip_check": False}}),
    ("pip", "/wheels/vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl",
     {"pip": {"packages": ["/wheels/vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl"], "pip_check": False}}),
    ("pip", "vllm @ git+https://github.com/vllm-project/vllm@abc123",
     {"pip": {"packages": ["vllm @ git+https://github.com/vllm-project/vllm@abc123"], "pip_check": False}}),
    ("image", "vllm/vllm-openai:v0.11.0", {"image_uri": "vllm/vllm-openai:v0.11.0"}),
    ("python", "/opt/vllm/bin/python", {"py_executable": "/opt/vllm/bin/python"}),
])
def test_each_build_kind_becomes_the_runtime_env_ray_expects(kind, value, expected):
    from ray.runtime_env import RuntimeEnv

    env = runtime_env_for(Build("b", 0, kind, value))
    assert env == expected
    assert set(env) <= RuntimeEnv.known_fields
    json.dumps(env)   # plain values: it crosses the Ray boundary inside the SoakSpec
    if kind != "image":   # Ray validates an image_uri against the node's container runtime at set-up
        assert dict(RuntimeEnv(**env, _validate=True)).items() >= {k: v for k, v in env.items() if k != "pip"}.items()


def test_a_setup_timeout_becomes_ray_config():
    env = runtime_env_for(Build("b", 0, "image", "img:1", setup_timeout_s=1200.0))
    assert env == {"image_uri": "img:1", "config": {"setup_timeout_seconds": 1200}}
    from ray.runtime_env import RuntimeEnv
    assert RuntimeEnv(**env)["config"]["setup_timeout_seconds"] == 1200


def test_the_soak_spec_carries_the_build_its_runtime_env_and_the_engine_env(tmp_path):
    m = load(BUILDS)
    pc = plan(m).cells[1]
    spec = soak_spec_for(pc, m, out_dir=tmp_path)
    assert (spec.build, spec.build_ordinal) == ("sha", 1)
    assert spec.runtime_env == runtime_env_for(m.builds["sha"])
    assert spec.env[BUILD_ENV] == "sha" and spec.env[BUILD_ORDINAL_ENV] == "1"
    assert runtime_env_option(spec) == {"runtime_env": spec.runtime_env}
    plain = soak_spec_for(plan(load(BASE)).cells[0], load(BASE), out_dir=tmp_path)
    assert plain.runtime_env is None and BUILD_ENV not in plain.env and runtime_env_option(plain) == {}


def test_hang_model_when_build_by_name_ordinal_or_list():
    model = load_hang_model("h.yaml", text=textwrap.dedent("""\
        hangs:
          - {id: a, style: silent_stall, mttf_s: 60, when: {build: 1}}
          - {id: b, style: silent_stall, mttf_s: 60, when: {build: [sha, 3], async_scheduling: true}}
          - {id: c, style: silent_stall, mttf_s: 60}
    """), builds=["v0.11.0", "sha", "img", "local"])
    a, b, c = model.hangs
    assert a.builds == (1,) and a.when == {}
    assert [h.id for h in model.active({}, None, build=(1, "sha"))] == ["a", "b", "c"]
    assert [h.id for h in model.active({}, None, build=(0, "v0.11.0"))] == ["c"]
    assert [h.id for h in model.active({}, None, build=(3, "local"))] == ["b", "c"]
    assert [h.id for h in model.active({}, None)] == ["c"]   # an engine that does not know its build
    flags = {"async_scheduling": True}
    assert [x.hang.id for x in arm(model, flags, None, 0, build=(2, "img"))] == ["c"]
    assert [x.hang.id for x in arm(model, flags, None, 0, build=(1, "sha"))] == ["a", "b", "c"]


def test_hang_model_build_names_are_checked_against_the_matrix(tmp_path):
    hangs = tmp_path / "hangs.yaml"
    hangs.write_text(textwrap.dedent("""\
        hangs:
          - {id: a, style: silent_stall, mttf_s: 60, when: {build: 7}}
          - {id: b, style: silent_stall, mttf_s: 60, when: {build: [sha, nope, true]}}
          - id: c
            style: silent_stall
            mttf_s: 60
            modifiers: [{when: {build: 1}, mttf_factor: 2}]
    """))
    matrix = tmp_path / "m.yaml"
    matrix.write_text(BUILDS + "sim: {hang_model: hangs.yaml}\n")
    with pytest.raises(SpecError) as info:
        load_matrix(matrix)
    found = [str(p) for p in info.value.problems]
    assert f"{hangs}:2: hangs[0].when.build: build ordinal 7 is past the last build (3)" in found
    assert any(p.startswith(f"{hangs}:3: hangs[1].when.build[1]: unknown build 'nope'") for p in found)
    assert any(p.startswith(f"{hangs}:3: hangs[1].when.build[2]: expected a build name or ordinal") for p in found)
    assert any("modifiers[0].when.build: `build` belongs in the hang's own `when`" in p for p in found)
    matrix.write_text(BASE + "sim: {hang_model: hangs.yaml}\n")
    with pytest.raises(SpecError) as info:
        load_matrix(matrix)
    assert any("the matrix has no `builds:` section" in str(p) for p in info.value.problems)


def test_the_simulated_engine_reads_its_build_from_the_environment():
    assert parse_sim_argv(["org/m"], environ={}).build is None
    config = parse_sim_argv(["org/m"], environ={BUILD_ENV: "sha", BUILD_ORDINAL_ENV: "1"})
    assert config.build == (1, "sha")
    with pytest.raises(SimUsageError):
        parse_sim_argv(["org/m"], environ={BUILD_ENV: "sha", BUILD_ORDINAL_ENV: "one"})


def test_a_build_ray_cannot_set_up_is_a_config_or_infra_error_of_that_build(tmp_path):
    m = load(BUILDS)
    spec = soak_spec_for(plan(m).cells[0], m, out_dir=tmp_path)
    pip_says = ("Failed to set up runtime environment.\n[Node 1.2.3.4] Traceback (most recent call last):\n"
                + "  File x\n" * 30 + "ERROR: No matching distribution found for vllm==0.11.0")
    result = setup_failure_result(spec, pip_says)
    assert result.outcome is Outcome.CONFIG_ERROR
    assert result.build == "v0.11.0" and result.build_ordinal == 0 and result.cell_id == spec.cell_id
    assert result.message.startswith("build v0.11.0: Ray could not set up its runtime_env (pip)")
    assert result.message.endswith("No matching distribution found for vllm==0.11.0")
    assert len(result.message.splitlines()) <= 14
    timeout = "Failed to set up runtime environment.\nFailed to install runtime_env within the timeout of 600 seconds."
    assert setup_failure_result(spec, timeout).outcome is Outcome.INFRA_ERROR
    assert setup_error_outcome("pip: NewConnectionError: [Errno 111] Connection refused") is Outcome.INFRA_ERROR
    assert setup_error_outcome("manifest for vllm/vllm-openai:v9 not found") is Outcome.CONFIG_ERROR
    token = "ghp_" + "a" * 36
    leaked = setup_failure_result(spec, f"Failed to create runtime env {{'pip': ['vllm @ git+https://{token}@github.com/x/y']}}")
    assert token not in leaked.message


def test_the_interpreter_of_a_python_build_is_checked_where_it_runs():
    assert interpreter_of({"py_executable": "/opt/env/bin/python -X dev"}) == "/opt/env/bin/python"
    assert interpreter_of({"pip": ["x"]}) is None and interpreter_of(None) is None
    assert interpreter_present(sys.executable)
    assert not interpreter_present("/nonexistent/bin/python3")
