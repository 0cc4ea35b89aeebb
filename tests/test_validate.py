"""The argv check: vLLM's own parser, serve checks and engine config decide, and `soakmatrix plan`
drops what vLLM would refuse. The `vllm`-marked tests compare with what the real server does."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace as NS

import pytest

from soakmatrix.matrix import validate
from soakmatrix.matrix.validate import VllmArgvChecker, argparse_message, exception_message, validate_cells


def fake_checker(config_error: str | None = None) -> VllmArgvChecker:
    def make_parser():
        p = argparse.ArgumentParser(prog="vllm serve")
        p.add_argument("--model")
        p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
        p.add_argument("--max-num-seqs", type=int, default=256)
        return p

    def validate_parsed(args):
        if args.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")

    def build_config(args):
        if config_error and args.kv_cache_dtype == "fp8":
            raise NotImplementedError(config_error)
        return object()

    return VllmArgvChecker("9.9", make_parser, validate_parsed, build_config)


def cell(cid: str, model: str, *args: str):
    return NS(id=cid, model_path=model, serve_args=tuple(args))


def test_parser_errors_come_back_as_vllm_words():
    checker = fake_checker()
    assert checker.check(["--model", "m", "--kv-cache-dtype", "bogus"], with_config=False).startswith(
        "error: argument --kv-cache-dtype: invalid choice: 'bogus'")
    assert checker.check(["--model", "m", "--nope"], with_config=False) == "error: unrecognized arguments: --nope"
    assert checker.check(["--model", "m", "--max-num-seqs", "0"], with_config=False) == \
        "ValueError: max_num_seqs must be >= 1"
    assert checker.check(["--model", "m"], with_config=True) is None


def test_config_step_runs_only_for_models_on_this_machine(tmp_path):
    local = tmp_path / "model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    checker = fake_checker(config_error="fp8 KV cache is not supported here")
    status, rejected = validate_cells([cell("a", str(local), "--kv-cache-dtype", "fp8"),
                                       cell("b", "org/remote-model", "--kv-cache-dtype", "fp8"),
                                       cell("c", str(local))], checker)
    assert rejected == {"a": "NotImplementedError: fp8 KV cache is not supported here"}
    assert status == ("checked 3 argv with vLLM 9.9's parser (2 with the engine config, 1 parser only "
                      "(model not on this machine)): 1 rejected")


def test_without_vllm_the_check_is_skipped(monkeypatch):
    monkeypatch.setattr(validate, "load_checker", lambda: None)
    status, rejected = validate_cells([cell("a", "m")])
    assert status.startswith("skipped: vLLM is not importable") and rejected == {}


def test_messages_keep_the_reason_and_drop_the_noise():
    assert argparse_message("usage: x\nvllm serve: error: unrecognized arguments: --a\n") == \
        "error: unrecognized arguments: --a"
    assert argparse_message("") == "rejected by vLLM's argument parser"

    class ValidationError(Exception):
        pass

    exc = ValidationError("1 validation error for VllmConfig\n  Value error, async scheduling is only supported "
                          "with EAGLE [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]\n"
                          "    For further information visit https://errors.pydantic.dev")
    assert exception_message(exc) == "ValidationError: Value error, async scheduling is only supported with EAGLE"


# -- against the installed vLLM ------------------------------------------------------------------------

def _has_vllm() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


vllm_only = [pytest.mark.vllm, pytest.mark.slow,
             pytest.mark.skipif(not _has_vllm(), reason="vLLM is not installed (make install-vllm)")]

# argv after `--model TINY --max-model-len 256`: None = vLLM starts, else a piece of its refusal
CASES = {
    "defaults": ([], None),
    "cpu-rewrites-cudagraph": (["--compilation-config", '{"cudagraph_mode": "FULL"}'], None),
    "prefix-chunked-eager": (["--no-enable-prefix-caching", "--no-enable-chunked-prefill", "--enforce-eager"], None),
    "ngram": (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}'],
              None),
    "kv-fp8": (["--kv-cache-dtype", "fp8"], None),
    "kv-bogus": (["--kv-cache-dtype", "bogus"], "invalid choice: 'bogus'"),
    "unknown-flag": (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    "mtp-without-weights": (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
                            "Unsupported speculative method: 'mtp'"),
    "async-with-ngram": (["--async-scheduling", "--speculative-config",
                          '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}'],
                         "async scheduling is only supported"),
    "max-num-seqs-0": (["--max-num-seqs", "0"], "greater than or equal to 1"),
    "too-long": (["--max-model-len", "100000"], "max_model_len"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from soakmatrix.fixtures.tiny_model import ensure_tiny_model
    return str(ensure_tiny_model())


@pytest.fixture(scope="module")
def real_checker():
    checker = validate.load_checker()
    assert checker is not None, "vLLM is installed but its parser could not be loaded"
    return checker


@pytest.mark.parametrize("name", list(CASES))
def test_the_real_checker_agrees_with_vllm(name, tiny, real_checker):
    extra, refusal = CASES[name]
    message = real_checker.check(["--model", tiny, "--max-model-len", "256", *extra], with_config=True)
    if refusal is None:
        assert message is None
    else:
        assert message is not None and refusal in message, message


for _mark in vllm_only:
    test_the_real_checker_agrees_with_vllm = _mark(test_the_real_checker_agrees_with_vllm)


def _serve(argv: list[str], timeout_s: float = 240) -> tuple[int, str]:
    """Run vLLM's real server until it exits (a refused argv exits before any weights load)."""
    from soakmatrix.jobs.engines.vllm import serve_module
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-m", serve_module(), *argv, "--host", "127.0.0.1", "--port", "9"],
                          capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env})
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["mtp-without-weights"])
def test_the_real_server_refuses_the_same_argv(name, tiny, real_checker):
    extra, refusal = CASES[name]
    argv = ["--model", tiny, "--max-model-len", "256", *extra]
    assert refusal in real_checker.check(argv, with_config=True)
    code, output = _serve(argv)
    assert code != 0 and refusal in output, output[-2000:]


for _mark in vllm_only:
    test_the_real_server_refuses_the_same_argv = _mark(test_the_real_server_refuses_the_same_argv)


def test_plan_drops_the_cells_vllm_refuses(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(textwrap.dedent("""\
        name: cpu-argv
        models:
          tiny: {path: soakmatrix/tiny-llama, weights_gb: 0.001, args: [--max-model-len, "256"]}
        gpus:
          cpu: {count: 1, memory_gb: 4, ray_label: cpu}
        axes:
          ngram: [0, 2]
          async_scheduling: [true, false]
        workloads:
          w: {kind: random}
        profiles:
          p: {coverage: full, soak: 1m, startup: 2m, workloads: [w]}
        """))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "plan", str(matrix), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)          # vLLM's logging must not leak into the JSON
    assert "1 rejected" in plan["validation"] and "4 with the engine config" in plan["validation"]
    assert [r["combo"]["ngram"] for r in plan["rejected"]] == [2]
    assert plan["rejected"][0]["combo"]["async_scheduling"] is True
    assert "async scheduling is only supported" in plan["rejected"][0]["reason"]
    assert len(plan["cells"]) == 3
    assert time.monotonic() - t0 < 240


for _mark in vllm_only:
    test_plan_drops_the_cells_vllm_refuses = _mark(test_plan_drops_the_cells_vllm_refuses)
