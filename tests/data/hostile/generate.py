"""Writes the hostile-input corpus: matrix and hang-model files a hostile but fair user might feed
soakmatrix, each with the problem its error must name (`expected.yaml`). Run it after adding a case:
    python tests/data/hostile/generate.py
Each file must end as exit 2 with a `file:line: key: message` error; tests/test_hostile_inputs.py
checks every one, in a process with bounded memory and time.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import yaml

HERE = Path(__file__).resolve().parent

BASE_MATRIX: dict[str, Any] = {
    "name": "hostile",
    "models": {"tiny-moe": {"path": "soakmatrix/tiny-moe", "weights_gb": 1, "mtp_head": True, "moe": True}},
    "gpus": {"H200": {"count": 8, "memory_gb": 141, "ray_label": "H200"}},
    "axes": {"mtp": [0, 1], "cudagraph_mode": ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"], "tp": [1, 2]},
    "workloads": {"staggered": {"kind": "random", "concurrency": 8, "input_len": [32, 256],
                                "output_len": [16, 128]}},
    "profiles": {"demo": {"coverage": "full", "soak": "45m", "startup": "5s", "workloads": ["staggered"],
                          "budget_gpu_hours": 10}},
    "baseline": {"mtp": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "tp": 1},
    "sim": {"hang_model": "hangs/valid.yaml", "time_scale": 150},
}

BASE_HANGS: dict[str, Any] = {
    "seed": 7,
    "hangs": [{"id": "mtp-cudagraph", "style": "shm_broadcast",
               "when": {"mtp": [1, 2], "cudagraph_mode": "FULL_AND_PIECEWISE"},
               "gpu": ["H200"], "min_running": 2, "mttf_s": 600,
               "modifiers": [{"when": {"flashinfer_autotune": False}, "mttf_factor": 8}]}],
}


def edit(base: dict, fn: Callable[[dict], None]) -> str:
    doc = copy.deepcopy(base)
    fn(doc)
    return yaml.safe_dump(doc, sort_keys=False)


def setter(*path_and_value: Any) -> Callable[[dict], None]:
    *path, value = path_and_value

    def fn(doc: dict) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return fn


def deleter(*path: Any) -> Callable[[dict], None]:
    def fn(doc: dict) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return fn


def m(*path_and_value: Any) -> str:
    return edit(BASE_MATRIX, setter(*path_and_value))


def h(*path_and_value: Any) -> str:
    return edit(BASE_HANGS, setter(*path_and_value))


def bomb(levels: int = 9) -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for name in "bcdefghij"[:levels - 1]:
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    return text


VALID_MATRIX = yaml.safe_dump(BASE_MATRIX, sort_keys=False)
VALID_HANGS = yaml.safe_dump(BASE_HANGS, sort_keys=False)
M_NO_SIM = edit(BASE_MATRIX, deleter("sim"))

# name -> (text or bytes, a fragment the error must contain). Matrix files at the top, hang models
# under hangs/ (each checked through a matrix that names it).
MATRICES: dict[str, tuple[str | bytes, str]] = {
    # YAML itself
    "alias_bomb": (VALID_MATRIX + bomb(), "alias bomb"),
    "alias_bomb_in_axes": (M_NO_SIM.replace("axes:", "x: &x [1,1,1,1,1,1,1,1,1,1]\n"
                                            "y: &y [*x,*x,*x,*x,*x,*x,*x,*x,*x,*x]\n"
                                            "z: &z [*y,*y,*y,*y,*y,*y,*y,*y,*y,*y]\n"
                                            "w: &w [*z,*z,*z,*z,*z,*z,*z,*z,*z,*z]\n"
                                            "v: &v [*w,*w,*w,*w,*w,*w,*w,*w,*w,*w]\n"
                                            "u: [*v,*v,*v,*v,*v,*v,*v,*v,*v,*v]\naxes:"), "alias bomb"),
    "deep_nesting": ("a: " + "[" * 5_000 + "]" * 5_000 + "\n", "nested more than"),
    "deep_mapping": ("a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 60)), "nested more than"),
    "self_alias": ("a: &a [*a]\n" + VALID_MATRIX, "nested more than"),
    "latin1": (VALID_MATRIX.replace("hostile", "caf\xe9").encode("latin-1"), "not UTF-8"),
    "utf16": (VALID_MATRIX.encode("utf-16"), "not UTF-8"),
    "nul_byte": (VALID_MATRIX.replace("hostile", "host\x00ile").encode(), "NUL byte"),
    "python_tag": (VALID_MATRIX.replace("name: hostile", "name: !!python/object/apply:os.system [echo hi]"),
                   "is not allowed"),
    "custom_tag": (VALID_MATRIX.replace("name: hostile", "name: !secret hostile"), "is not allowed"),
    "binary_tag": (VALID_MATRIX.replace("name: hostile", "name: !!binary aG9zdGlsZQ=="), "is not allowed"),
    "set_tag": (VALID_MATRIX.replace("name: hostile", "name: !!set {a, b}"), "is not allowed"),
    "huge_int": (VALID_MATRIX.replace("concurrency: 8", "concurrency: " + "9" * 5000), "concurrency"),
    "long_scalar": (VALID_MATRIX.replace("name: hostile", "name: " + "x" * 100_000), "longer than"),
    "tab_indent": (VALID_MATRIX.replace("  tiny-moe:", "\ttiny-moe:"), "invalid YAML"),
    "unclosed_bracket": (VALID_MATRIX.replace("mtp:\n  - 0", "mtp: [0, 1\n  - 0"), "invalid YAML"),
    "unclosed_quote": (VALID_MATRIX.replace("name: hostile", 'name: "hostile'), "invalid YAML"),
    "two_documents": (VALID_MATRIX + "---\n" + VALID_MATRIX, "invalid YAML"),
    "duplicate_key": (VALID_MATRIX.replace("name: hostile", "name: hostile\nname: again"), "duplicate key"),
    "top_level_list": ("- name: hostile\n", "expected a mapping"),
    "top_level_scalar": ("hostile\n", "expected a mapping"),
    "empty_file": ("", "empty"),
    "only_comments": ("# nothing here\n", "empty"),
    "merge_of_scalar": (VALID_MATRIX.replace("name: hostile", "name: hostile\nx:\n  <<: 3"), "merge key"),
    "merge_brings_unknown_key": ("defaults: &d {concurrency: 8, colour: red}\n" + VALID_MATRIX.replace(
        "    kind: random\n", "    kind: random\n    <<: *d\n"), "colour"),
    "complex_key": (VALID_MATRIX.replace("name: hostile", "? [a, b]\n: hostile\nname: hostile"), "scalar"),
    "nan_soak": (m("profiles", "demo", "soak", float("nan")), "finite"),
    "inf_budget": (m("profiles", "demo", "budget_gpu_hours", float("inf")), "finite"),
    "neg_inf_weights": (m("models", "tiny-moe", "weights_gb", float("-inf")), "finite"),
    "nan_memory": (m("gpus", "H200", "memory_gb", float("nan")), "finite"),
    "inf_time_scale": (m("sim", "time_scale", float("inf")), "finite"),
    "nan_rate": (m("workloads", "staggered", "rate", float("nan")), "finite"),
    # the matrix's keys and values
    "unknown_top_key": (m("colour", "red"), "colour"),
    "name_list": (m("name", ["a", "b"]), "name"),
    "name_empty": (m("name", ""), "name"),
    "models_empty": (m("models", {}), "models"),
    "models_list": (m("models", ["tiny-moe"]), "models"),
    "model_no_path": (edit(BASE_MATRIX, deleter("models", "tiny-moe", "path")), "path"),
    "model_weights_negative": (m("models", "tiny-moe", "weights_gb", -1), "weights_gb"),
    "model_weights_zero": (m("models", "tiny-moe", "weights_gb", 0), "weights_gb"),
    "model_weights_text": (m("models", "tiny-moe", "weights_gb", "heavy"), "weights_gb"),
    "model_mtp_head_text": (m("models", "tiny-moe", "mtp_head", "yes please"), "mtp_head"),
    "model_args_bool": (m("models", "tiny-moe", "args", True), "args"),
    "model_args_mapping": (m("models", "tiny-moe", "args", {"max-model-len": 4096}), "args"),
    "model_args_nested": (m("models", "tiny-moe", "args", [["--a"]]), "args"),
    "model_unknown_key": (m("models", "tiny-moe", "colour", "red"), "colour"),
    "model_not_mapping": (m("models", "tiny-moe", "soakmatrix/tiny-moe"), "tiny-moe"),
    "gpus_empty": (m("gpus", {}), "gpus"),
    "gpu_count_zero": (m("gpus", "H200", "count", 0), "count"),
    "gpu_count_negative": (m("gpus", "H200", "count", -8), "count"),
    "gpu_count_fraction": (m("gpus", "H200", "count", 1.5), "count"),
    "gpu_count_text": (m("gpus", "H200", "count", "eight"), "count"),
    "gpu_memory_zero": (m("gpus", "H200", "memory_gb", 0), "memory_gb"),
    "gpu_memory_negative": (m("gpus", "H200", "memory_gb", -141), "memory_gb"),
    "gpu_label_empty": (m("gpus", "H200", "ray_label", ""), "ray_label"),
    "gpu_unknown_key": (m("gpus", "H200", "vendor", "nvidia"), "vendor"),
    "gpu_two_problems": (edit(BASE_MATRIX, lambda d: d["gpus"]["H200"].update(count=0, memory_gb=-1)),
                         "memory_gb"),
    "model_two_problems": (edit(BASE_MATRIX, lambda d: d["models"]["tiny-moe"].update(weights_gb=-1,
                                                                                       mtp_head="x")),
                           "mtp_head"),
    "axes_unknown_flag": (m("axes", "turbo", [True, False]), "turbo"),
    "axes_empty_values": (m("axes", "mtp", []), "mtp"),
    "axes_wrong_type": (m("axes", "tp", ["one", "two"]), "tp"),
    "axes_tp_zero": (m("axes", "tp", [0, 1]), "tp"),
    "axes_tp_negative": (m("axes", "tp", [-2, 1]), "tp"),
    "axes_bad_choice": (m("axes", "cudagraph_mode", ["FULL", "SOMETIMES"]), "cudagraph_mode"),
    "axes_not_mapping": (m("axes", ["mtp", "tp"]), "axes"),
    "axes_duplicate_value": (m("axes", "tp", [1, 1]), "tp"),
    "exclude_not_an_axis": (m("exclude", [{"async_scheduling": True}]), "async_scheduling"),
    "exclude_unknown_key": (m("exclude", [{"colour": "red"}]), "colour"),
    "exclude_not_list": (m("exclude", {"tp": 2}), "exclude"),
    "exclude_entry_scalar": (m("exclude", ["tp"]), "exclude"),
    "exclude_unknown_model": (m("exclude", [{"model": "nope"}]), "model"),
    "exclude_value_not_on_axis": (m("exclude", [{"tp": 8}]), "tp"),
    "exclude_everything": (m("exclude", [{"model": "tiny-moe"}]), "no cell"),
    "include_unknown_key": (m("include", [{"colour": "red"}]), "colour"),
    "include_unknown_gpu": (m("include", [{"gpu": "B200", "tp": 1}]), "gpu"),
    "workloads_empty": (m("workloads", {}), "workloads"),
    "workload_unknown_kind": (m("workloads", "staggered", "kind", "tsunami"), "kind"),
    "workload_concurrency_zero": (m("workloads", "staggered", "concurrency", 0), "concurrency"),
    "workload_concurrency_negative": (m("workloads", "staggered", "concurrency", -5), "concurrency"),
    "workload_rate_zero": (edit(BASE_MATRIX, lambda d: d["workloads"]["staggered"].update(loop="open", rate=0)),
                           "rate"),
    "workload_max_requests_zero": (m("workloads", "staggered", "max_requests", 0), "max_requests"),
    "workload_input_len_reversed": (m("workloads", "staggered", "input_len", [256, 32]), "input_len"),
    "workload_output_len_negative": (m("workloads", "staggered", "output_len", [-16, 128]), "output_len"),
    "workload_output_len_zero": (m("workloads", "staggered", "output_len", [0, 0]), "output_len"),
    "workload_timeout_zero": (m("workloads", "staggered", "request_timeout_s", 0), "request_timeout_s"),
    "workload_unknown_param": (m("workloads", "staggered", "colour", "red"), "colour"),
    "workload_bad_loop": (m("workloads", "staggered", "loop", "sideways"), "loop"),
    "profile_soak_zero": (m("profiles", "demo", "soak", 0), "soak"),
    "profile_soak_negative": (m("profiles", "demo", "soak", "-5m"), "soak"),
    "profile_soak_words": (m("profiles", "demo", "soak", "a while"), "soak"),
    "profile_startup_words": (m("profiles", "demo", "startup", "forever"), "startup"),
    "profile_budget_zero": (m("profiles", "demo", "budget_gpu_hours", 0), "budget_gpu_hours"),
    "profile_budget_negative": (m("profiles", "demo", "budget_gpu_hours", -1), "budget_gpu_hours"),
    "profile_coverage_zero": (m("profiles", "demo", "coverage", {"t": 0}), "coverage"),
    "profile_coverage_words": (m("profiles", "demo", "coverage", "pairwise-ish"), "coverage"),
    "profile_unknown_workload": (m("profiles", "demo", "workloads", ["tsunami"]), "workloads"),
    "profile_no_workloads": (m("profiles", "demo", "workloads", []), "workloads"),
    "profile_unknown_model": (m("profiles", "demo", "models", ["gpt-9"]), "models"),
    "profile_unknown_gpu": (m("profiles", "demo", "gpus", ["B200"]), "gpus"),
    "profile_retries_negative": (m("profiles", "demo", "retries", -1), "retries"),
    "profile_unknown_key": (m("profiles", "demo", "colour", "red"), "colour"),
    "profiles_empty": (m("profiles", {}), "profiles"),
    "baseline_unknown_flag": (m("baseline", "turbo", True), "turbo"),
    "baseline_bad_value": (m("baseline", "cudagraph_mode", "SOMETIMES"), "cudagraph_mode"),
    "custom_flag_no_argv": (m("flags", {"block_size": {"type": "int"}}), "block_size"),
    "custom_flag_bad_type": (m("flags", {"block_size": {"type": "complex", "argv": ["--block-size", "{value}"]}}),
                             "type"),
    "custom_flag_argv_number": (m("flags", {"block_size": {"type": "int", "argv": 16}}), "argv"),
    "source_deps_unknown_flag": (m("source_dependencies", {"vllm/**": ["turbo"]}), "turbo"),
    "source_deps_not_mapping": (m("source_dependencies", ["vllm/**"]), "source_dependencies"),
    "sim_time_scale_zero": (m("sim", "time_scale", 0), "time_scale"),
    "sim_time_scale_negative": (m("sim", "time_scale", -150), "time_scale"),
    "sim_missing_hang_model": (m("sim", "hang_model", "hangs/nope.yaml"), "hang_model"),
    "sim_unknown_key": (m("sim", "colour", "red"), "colour"),
    "huge_product": (edit(BASE_MATRIX, lambda d: d["axes"].update(
        max_num_seqs=list(range(1, 101)), max_num_batched_tokens=list(range(1024, 1024 + 100 * 64, 64)),
        prefix_caching=[True, False], chunked_prefill=[True, False], enforce_eager=[True, False],
        async_scheduling=[True, False], kv_cache_dtype=["auto", "fp8"])), "combinations"),
}

HANG_MODELS: dict[str, tuple[str | bytes, str]] = {
    "alias_bomb": (VALID_HANGS + bomb(), "alias bomb"),
    "deep_nesting": ("hangs: " + "[" * 5_000 + "]" * 5_000 + "\n", "nested more than"),
    "latin1": (VALID_HANGS.replace("mtp-cudagraph", "caf\xe9").encode("latin-1"), "not UTF-8"),
    "python_tag": (VALID_HANGS.replace("seed: 7", "seed: !!python/object/apply:os.getpid []"), "is not allowed"),
    "unknown_style": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(style="meltdown")), "style"),
    "mttf_zero": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(mttf_s=0)), "mttf_s"),
    "mttf_negative": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(mttf_s=-600)), "mttf_s"),
    "mttf_nan": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(mttf_s=float("nan"))), "finite"),
    "mttf_inf": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(mttf_s=float("inf"))), "finite"),
    "when_unknown_flag": (edit(BASE_HANGS, lambda d: d["hangs"][0]["when"].update(turbo=True)), "turbo"),
    "when_bad_value": (edit(BASE_HANGS, lambda d: d["hangs"][0]["when"].update(tp="four")), "tp"),
    "gpu_empty": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(gpu=[])), "gpu"),
    "factor_zero": (edit(BASE_HANGS, lambda d: d["hangs"][0]["modifiers"][0].update(mttf_factor=0)),
                    "mttf_factor"),
    "factor_negative": (edit(BASE_HANGS, lambda d: d["hangs"][0]["modifiers"][0].update(mttf_factor=-8)),
                        "mttf_factor"),
    "modifier_unknown_flag": (edit(BASE_HANGS, lambda d: d["hangs"][0]["modifiers"][0].update(
        when={"turbo": True})), "turbo"),
    "hangs_not_list": (h("hangs", {"id": "x"}), "hangs"),
    "hang_no_id": (edit(BASE_HANGS, lambda d: d["hangs"][0].pop("id")), "id"),
    "duplicate_id": (edit(BASE_HANGS, lambda d: d["hangs"].append(copy.deepcopy(d["hangs"][0]))), "id"),
    "hang_unknown_key": (edit(BASE_HANGS, lambda d: d["hangs"][0].update(colour="red")), "colour"),
    "seed_text": (h("seed", "lucky"), "seed"),
    "unknown_top_key": (h("colour", "red"), "colour"),
}


def write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


def main() -> None:
    expected: dict[str, str] = {}
    write(HERE / "hangs" / "valid.yaml", VALID_HANGS)
    for name, (content, fragment) in MATRICES.items():
        write(HERE / f"{name}.yaml", content)
        expected[f"{name}.yaml"] = fragment
    for name, (content, fragment) in HANG_MODELS.items():
        write(HERE / "hangs" / f"{name}.yaml", content)
        write(HERE / f"hm_{name}.yaml", m("sim", "hang_model", f"hangs/{name}.yaml"))
        expected[f"hm_{name}.yaml"] = fragment
    (HERE / "expected.yaml").write_text(
        "# file -> a fragment its error must contain (written by generate.py)\n"
        + yaml.safe_dump(expected, sort_keys=True, allow_unicode=True), encoding="utf-8")
    print(f"{len(MATRICES)} matrix files, {len(HANG_MODELS)} hang models (each behind a matrix)")


if __name__ == "__main__":
    main()
