"""Secrets given to any subcommand stay out of what it prints and writes: a URL's `user:password@` and
its `?api_key=` / `?token=`, a model's `--api-key`, a build URL with a token, and the API keys of the
environment (OPENAI_API_KEY, VLLM_API_KEY, HF_TOKEN). Each subcommand runs once with them planted and
its stdout, stderr and every file it wrote are searched. `run` with a planted hang (evidence, py-spy,
JUnit, the store, the dashboard) is tests/test_secrets.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli
from tests.conftest import EXAMPLES, REPO

PASSWORD = "pw-planted-0123456789"
QUERY_TOKEN = "qt-planted-0123456789"
API_KEY = "sk-plantedsecretvalue0123456789"
BUILD_TOKEN = "bt-planted-0123456789"
ENV_KEYS = {"OPENAI_API_KEY": "env-openai-planted-0123", "VLLM_API_KEY": "env-vllm-planted-0123",
            "HF_TOKEN": "hf_envplantedtokenvalue0123"}
SECRETS = [PASSWORD, QUERY_TOKEN, API_KEY, BUILD_TOKEN, *ENV_KEYS.values()]
FAILING = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"


def leaks(*texts: str, folder: Path | None = None) -> list[str]:
    found = [f"output {i}: {s}" for i, text in enumerate(texts) for s in SECRETS if s in text]
    for path in (folder.rglob("*") if folder else ()):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in SECRETS if s.encode() in data]
    return found


def in_process(argv: list[str], monkeypatch) -> tuple[int, str, str]:
    for name, value in ENV_KEYS.items():
        monkeypatch.setenv(name, value)
    return run_cli(argv)  # type: ignore[return-value]


@pytest.fixture
def matrix(tmp_path) -> Path:
    """The demo matrix with an API key in the model's args."""
    text = (EXAMPLES / "demo.yaml").read_text().replace("hangs/demo.yaml", str(EXAMPLES / "hangs" / "demo.yaml"))
    path = tmp_path / "demo.yaml"
    path.write_text(text.replace("    moe: true\n", f"    moe: true\n    args: [--api-key, {API_KEY}]\n", 1))
    return path


def test_plan_text_and_json(matrix, monkeypatch):
    # and a build whose URL holds a token
    matrix.write_text(matrix.read_text() + "builds:\n  nightly: {pip: 'vllm @ git+https://ci:"
                      f"{BUILD_TOKEN}@git.example.org/vllm.git@abc123'}}\n")
    for extra in ([], ["--json"]):
        code, out, err = in_process(["plan", str(matrix), "--no-validate", *extra], monkeypatch)
        assert code == 0, err
        assert not leaks(out, err) and "[redacted]" in out
    assert "git.example.org/vllm.git@abc123" in out   # what is no secret stays readable


def test_bisect_json_store_and_emitted_test(matrix, tmp_path, monkeypatch):
    store, emitted = tmp_path / "store.sqlite", tmp_path / "emitted" / "test_regression.py"
    code, out, err = in_process(["bisect", str(matrix), "--cell", FAILING, "--virtual", "--json", "--seed", "3",
                                 "--no-shrink", "--no-modifiers", "--store", str(store), "--emit-test", str(emitted),
                                 "--out", str(tmp_path / "journal")], monkeypatch)
    assert code == 1, err
    assert json.loads(out)["status"] == "found" and emitted.exists() and store.exists()
    assert not leaks(out, err, folder=tmp_path / "journal") and not leaks(emitted.read_text())
    assert not leaks(store.read_bytes().decode("latin-1"))


def test_bisect_names_a_ray_address_without_its_password(matrix, monkeypatch, tmp_path):
    address = f"ray://admin:{PASSWORD}@127.0.0.1:1"
    code, out, err = in_process(["bisect", str(matrix), "--cell", FAILING, "--ray-address", address,
                                 "--out", str(tmp_path / "b")], monkeypatch)
    assert code == 2 and "cannot reach Ray" in err and "admin:[redacted]@" in err, err
    assert not leaks(out, err, folder=tmp_path / "b")


@pytest.mark.parametrize("command", ["run", "smoke"])
def test_run_and_smoke_keep_no_ray_password_in_their_output_or_store(matrix, monkeypatch, tmp_path, command):
    address = f"ray://admin:{PASSWORD}@127.0.0.1:1"
    code, out, err = in_process([command, str(matrix), "--ray-address", address, "--out", str(tmp_path / "o")],
                                monkeypatch)
    assert code == 3 and "cannot reach Ray" in err and "admin:[redacted]@" in err, err
    assert (tmp_path / "o" / "history.sqlite").exists()
    assert not leaks(out, err, folder=tmp_path / "o")


def test_report_text_and_junit_of_a_store_that_holds_secrets(tmp_path, monkeypatch):
    """A store from an older version, with a watched URL and an argv holding secrets, reported today."""
    from soakmatrix.reports.history import HistoryStore

    url = f"http://admin:{PASSWORD}@vllm.internal:8000/?api_key={QUERY_TOKEN}"
    store = tmp_path / "store.sqlite"
    with HistoryStore(store) as s:
        run = s.start_run(matrix=url, profile="watch", kind="watch",
                          meta={"argv": ["watch", url, "--api-key", API_KEY], "url": url})
        s.finish_run(run, "finished")
    code, out, err = in_process(["report", str(store), "--junit", str(tmp_path / "junit.xml"),
                                 "--out", str(tmp_path / "site")], monkeypatch)
    assert code == 0, err
    assert "vllm.internal:8000" in out
    assert not leaks(out, err, (tmp_path / "junit.xml").read_text(), folder=tmp_path / "site")


def test_sim_engine_logs_no_api_key():
    from soakmatrix.jobs.sim.args import parse_sim_argv

    config = parse_sim_argv(["m", "--api-key", API_KEY, "--some-unmodelled-token=" + QUERY_TOKEN])
    assert not leaks(" ".join(config.notes)) and "--api-key [redacted]" in config.notes


def test_watch_prints_and_keeps_no_credential(tmp_path):
    url = f"http://admin:{PASSWORD}@127.0.0.1:9/v1?token={QUERY_TOKEN}"
    out = tmp_path / "incidents"
    env = {**os.environ, **ENV_KEYS}
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", url, "--duration", "2s",
                           "--canary", "1s", "--out", str(out), "--store", str(tmp_path / "store.sqlite")],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "query is not sent" in proc.stdout and "watching http://admin:[redacted]@127.0.0.1:9/v1 " in proc.stdout, \
        proc.stdout
    assert not leaks(proc.stdout, proc.stderr, folder=out)


def test_a_bad_watch_url_is_refused_without_echoing_its_password(monkeypatch):
    code, out, err = in_process(["watch", f"http://admin:{PASSWORD}@127.0.0.1:99999"], monkeypatch)
    assert code == 2 and "admin:[redacted]@" in err
    assert not leaks(out, err)
