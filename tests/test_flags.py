"""The flag registry maps canonical values to vLLM 0.33's exact argv."""

import json

import pytest

from soakmatrix.matrix.contracts.flags import REGISTRY, ArgvConflict, build_argv, raw_flag, resolve_defaults


def test_required_flags_are_registered():
    for name in ["async_scheduling", "cudagraph_mode", "mtp", "flashinfer_autotune", "tp", "prefix_caching",
                 "chunked_prefill", "kv_cache_dtype", "enforce_eager", "expert_parallel", "max_num_seqs"]:
        assert name in REGISTRY


@pytest.mark.parametrize("flags,expected", [
    ({"async_scheduling": True}, ["--async-scheduling"]),
    ({"async_scheduling": False}, ["--no-async-scheduling"]),
    ({"flashinfer_autotune": False}, ["--no-enable-flashinfer-autotune"]),
    ({"flashinfer_autotune": True}, ["--enable-flashinfer-autotune"]),
    ({"tp": 8}, ["--tensor-parallel-size", "8"]),
    ({"prefix_caching": False}, ["--no-enable-prefix-caching"]),
    ({"chunked_prefill": True}, ["--enable-chunked-prefill"]),
    ({"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8"]),
    ({"enforce_eager": True}, ["--enforce-eager"]),
    ({"enforce_eager": False}, []),
    ({"expert_parallel": True}, ["--enable-expert-parallel"]),
    ({"max_num_seqs": 8}, ["--max-num-seqs", "8"]),
    ({"mtp": 0}, []),
])
def test_plain_flags(flags, expected):
    argv, env = build_argv(flags)
    assert argv == expected
    assert env == {}


def test_json_flags_are_merged_not_repeated():
    argv, _ = build_argv({"cudagraph_mode": "FULL_AND_PIECEWISE", "mtp": 2, "tp": 8})
    assert argv.count("--compilation-config") == 1
    assert argv.count("--speculative-config") == 1
    comp = json.loads(argv[argv.index("--compilation-config") + 1])
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert comp == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert spec == {"method": "mtp", "num_speculative_tokens": 2}
    assert argv[:2] == ["--tensor-parallel-size", "8"]


def test_two_flags_setting_one_json_key_conflict():
    with pytest.raises(ArgvConflict, match="method"):
        build_argv({"mtp": 1, "ngram": 2})


def test_argv_does_not_depend_on_dict_order():
    a = build_argv({"mtp": 1, "tp": 4, "async_scheduling": True, "cudagraph_mode": "FULL"})
    b = build_argv({"cudagraph_mode": "FULL", "async_scheduling": True, "tp": 4, "mtp": 1})
    assert a == b


def test_unknown_flag_is_named():
    with pytest.raises(KeyError, match="nonsense"):
        build_argv({"nonsense": 1})


def test_value_checks():
    assert REGISTRY["tp"].check(0) is not None
    assert REGISTRY["tp"].check(True) is not None
    assert REGISTRY["mtp"].check(-1) is not None
    assert REGISTRY["cudagraph_mode"].check("SOMETIMES") is not None
    assert REGISTRY["async_scheduling"].check("yes") is not None
    assert REGISTRY["kv_cache_dtype"].check("fp8_e4m3") is None


def test_raw_flag_templates_argv_and_env():
    registry = dict(REGISTRY)
    registry["block_size"] = raw_flag("block_size", "int", ["--block-size", "{value}"])
    registry["sampler"] = raw_flag("sampler", "bool", env={"VLLM_USE_FLASHINFER_SAMPLER": "1"})
    argv, env = build_argv({"block_size": 256, "sampler": True, "tp": 2}, registry)
    assert argv == ["--tensor-parallel-size", "2", "--block-size", "256"]
    assert env == {"VLLM_USE_FLASHINFER_SAMPLER": "1"}
    assert build_argv({"sampler": False}, registry) == ([], {})


def test_resolve_defaults_fills_vllm_defaults():
    full = resolve_defaults({"mtp": 1})
    assert full["mtp"] == 1
    assert full["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert full["async_scheduling"] is True
    assert full["tp"] == 1
