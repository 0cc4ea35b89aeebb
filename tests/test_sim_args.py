"""The simulated engine's command line: registry argv round-trips, vLLM's refusals, exit code 2."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from soakmatrix.jobs.sim.args import SimUsageError, parse_sim_argv
from soakmatrix.matrix.contracts import flags as flagmod

# every value each registry flag can take, as far as a finite list goes
SAMPLE_VALUES = {
    "mtp": [0, 1, 2, 4],
    "ngram": [0, 1, 3],
    "tp": [1, 2, 4, 8],
    "max_num_seqs": [1, 8, 256, 1024],
    "max_num_batched_tokens": [8192, 16384],
}


def values_of(flag: flagmod.Flag) -> list:
    if flag.kind == "bool":
        return [True, False]
    if flag.choices:
        return list(flag.choices)
    return SAMPLE_VALUES[flag.name]


def roundtrip(flags: dict) -> dict:
    argv, _env = flagmod.build_argv(flags)
    return parse_sim_argv(["some/model", *argv], environ={}).flags


def test_every_registry_flag_is_sampled() -> None:
    for flag in flagmod.REGISTRY.values():
        assert values_of(flag), flag.name


@pytest.mark.parametrize("name", list(flagmod.REGISTRY))
def test_roundtrip_every_value_of_every_flag(name: str) -> None:
    for value in values_of(flagmod.REGISTRY[name]):
        assert roundtrip({name: value}) == flagmod.resolve_defaults({name: value}), (name, value)


def test_roundtrip_combinations_with_json_options_merged() -> None:
    combos = itertools.product(flagmod.CUDAGRAPH_MODES, [0, 1, 2], [True, False], [1, 8], ["auto", "fp8"])
    for mode, mtp, autotune, tp, kv in combos:
        flags = {"cudagraph_mode": mode, "mtp": mtp, "flashinfer_autotune": autotune, "tp": tp,
                 "kv_cache_dtype": kv, "async_scheduling": not autotune, "enforce_eager": autotune}
        assert roundtrip(flags) == flagmod.resolve_defaults(flags)


def test_defaults_filled_and_our_options() -> None:
    c = parse_sim_argv(["--model", "m", "--port", "1234", "--host", "0.0.0.0", "--gpu-type", "H200",
                        "--time-scale", "60", "--seed", "5", "--hang-record", "r.jsonl", "--hang-model", "h.yaml"],
                       environ={})
    assert c.model == "m" and c.port == 1234 and c.host == "0.0.0.0"
    assert c.flags == flagmod.resolve_defaults({})
    assert (c.gpu_type, c.time_scale, c.seed, c.hang_record, c.hang_model) == ("H200", 60.0, 5, "r.jsonl", "h.yaml")


def test_gpu_type_from_environment() -> None:
    assert parse_sim_argv(["m"], environ={"SOAKMATRIX_GPU_TYPE": "H20"}).gpu_type == "H20"
    assert parse_sim_argv(["m", "--gpu-type", "H200"], environ={"SOAKMATRIX_GPU_TYPE": "H20"}).gpu_type == "H200"


def test_other_spellings() -> None:
    c = parse_sim_argv(["m", "-tp", "2", "-cc", '{"cudagraph_mode": "piecewise"}', "--no-enable-flashinfer-autotune",
                        "--speculative-config.method", "mtp", "--speculative-config.num_speculative_tokens", "3",
                        "--max-num-seqs=7"], environ={})
    assert (c.flags["tp"], c.flags["cudagraph_mode"], c.flags["flashinfer_autotune"], c.flags["mtp"],
            c.flags["max_num_seqs"]) == (2, "PIECEWISE", False, 3, 7)


def test_unknown_flags_ignored_with_a_note() -> None:
    c = parse_sim_argv(["m", "--gpu-memory-utilization", "0.9", "--trust-remote-code", "--max-model-len", "256",
                        "--some-future-flag", "--load-format=dummy", "-O3"], environ={})
    assert c.max_model_len == 256 and c.model == "m"
    assert any("--gpu-memory-utilization 0.9" in n for n in c.notes)
    assert any("--some-future-flag" in n for n in c.notes)
    assert any("--load-format=dummy" in n for n in c.notes)
    assert c.flags == flagmod.resolve_defaults({})


@pytest.mark.parametrize("argv, reason", [
    (["m", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 0}'], "num_speculative_tokens"),
    (["m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": -1}'], "num_speculative_tokens"),
    (["m", "--speculative-config", '{"method": "warp", "num_speculative_tokens": 1}'], "Unsupported speculative"),
    (["m", "--speculative-config", "{not json"], "JSON"),
    (["m", "--compilation-config", '{"cudagraph_mode": "SOMETIMES"}'], "cudagraph_mode"),
    (["m", "--kv-cache-dtype", "fp4"], "invalid choice"),
    (["m", "--tensor-parallel-size", "0"], "tensor-parallel-size"),
    (["m", "-tp", "two"], "invalid int"),
    (["m", "--max-num-seqs", "0"], "max-num-seqs"),
    (["m", "--max-num-seqs", "64", "--max-num-batched-tokens", "32"], "max_num_batched_tokens"),
    (["m", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "1024"], "max_model_len"),
    (["m", "--async-scheduling", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
     "Async scheduling"),
    (["--port", "1"], "model"),
    (["m", "--time-scale", "0"], "time-scale"),
])
def test_refuses_what_vllm_refuses(argv: list[str], reason: str) -> None:
    with pytest.raises(SimUsageError, match=reason):
        parse_sim_argv(argv, environ={})


def test_cli_refusal_exits_2_before_listening(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "sim-engine", "m", "--port", "0",
                           "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 0}'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "num_speculative_tokens" in proc.stderr
    assert "Application startup complete" not in proc.stderr + proc.stdout


def test_cli_bad_hang_model_exits_2(tmp_path) -> None:
    bad = tmp_path / "hangs.yaml"
    bad.write_text("seed: 1\nhangs:\n  - id: x\n    style: explode\n    mttf_s: 10\n")
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "sim-engine", "m", "--hang-model", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "explode" in proc.stderr


def test_cli_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "sim-engine", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "--time-scale" in proc.stdout
