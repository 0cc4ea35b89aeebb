"""The simulated engine as a real process behind a real HTTP client: API, metrics, logs, processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import aiohttp
import psutil
import pytest

from soakmatrix.fixtures.sim_testing import SimProcess, load

pytestmark = [pytest.mark.slow, pytest.mark.waits]

# REFERENCE.md: the stats line, then optional parts
STATS_LINE = re.compile(
    r"^\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[loggers\.py:\d+\] Engine 000: "
    r"Avg prompt throughput: \d+\.\d tokens/s, Avg generation throughput: \d+\.\d tokens/s, "
    r"Running: \d+ reqs, Waiting: \d+ reqs(, Preemptions: \d+)?, GPU KV cache usage: \d+\.\d%, "
    r"Prefix cache hit rate: \d+\.\d%$")

METRIC_NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total",
    "vllm:request_success_total", "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_bucket",
    "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("sim") / "server.log"
    sp = SimProcess(["--served-model-name", "tiny", "--max-model-len", "512", "--seed", "3"], log,
                    model="org/tiny-model", env={"VLLM_LOG_STATS_INTERVAL": "1"})
    sp.start()
    yield sp
    sp.stop()
    assert not sp.leftover


async def post(url: str, body: dict, stream: bool = False) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as r:
            if not stream or r.status != 200:
                return r.status, await r.json(content_type=None)
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = []
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line:
                    assert line.startswith("data: "), line
                    events.append(line[6:])
            return r.status, events


def run(coro):
    return asyncio.run(coro)


def test_models_and_health(server) -> None:
    assert server.health() == 200
    status, text = server.get("/v1/models")
    data = json.loads(text)
    assert status == 200 and data["object"] == "list"
    assert data["data"][0]["id"] == "tiny" and data["data"][0]["root"] == "org/tiny-model"
    assert data["data"][0]["max_model_len"] == 512


def test_completion_non_streaming(server) -> None:
    status, data = run(post(server.url + "/v1/completions", {"model": "tiny", "prompt": "Hello there, world",
                                                             "max_tokens": 7}))
    assert status == 200
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 7
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                             "prompt_tokens_details": None}


def test_completion_streaming_with_usage(server) -> None:
    status, events = run(post(server.url + "/v1/completions",
                              {"prompt": [1, 5, 9, 12], "max_tokens": 9, "stream": True,
                               "stream_options": {"include_usage": True}}, stream=True))
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert sum(len(c["choices"][0]["text"].split()) for c in text_chunks) == 9
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9
    assert chunks[-1]["usage"]["prompt_tokens"] == 4


def test_streaming_without_usage_has_no_usage_chunk(server) -> None:
    _, events = run(post(server.url + "/v1/completions", {"prompt": "x y", "max_tokens": 3, "stream": True},
                         stream=True))
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"] for c in chunks)


def test_chat_non_streaming_and_streaming(server) -> None:
    body = {"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "Say something."}], "max_tokens": 6}
    status, data = run(post(server.url + "/v1/chat/completions", body))
    assert status == 200 and data["object"] == "chat.completion"
    msg = data["choices"][0]["message"]
    assert msg["role"] == "assistant" and len(msg["content"].split()) == 6
    assert data["usage"]["completion_tokens"] == 6

    status, events = run(post(server.url + "/v1/chat/completions",
                              {**body, "stream": True, "stream_options": {"include_usage": True}}, stream=True))
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == msg["content"]                   # same prompt, same seed: same tokens
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_chat_without_max_tokens_stops_by_itself(server) -> None:
    status, data = run(post(server.url + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "tell me"}]}))
    assert status == 200 and data["choices"][0]["finish_reason"] == "stop"
    assert 16 <= data["usage"]["completion_tokens"] <= 256


def test_errors(server) -> None:
    status, data = run(post(server.url + "/v1/completions", {"model": "other", "prompt": "x"}))
    assert status == 404 and "does not exist" in data["error"]["message"]
    status, data = run(post(server.url + "/v1/completions", {"prompt": "x " * 600, "max_tokens": 5}))
    assert status == 400 and "maximum context length is 512" in data["error"]["message"]
    status, data = run(post(server.url + "/v1/chat/completions", {"messages": "nope"}))
    assert status == 400


def test_determinism_for_a_seed(server, tmp_path) -> None:
    body = {"prompt": "the same prompt", "max_tokens": 12}
    first = run(post(server.url + "/v1/completions", body))[1]["choices"][0]["text"]
    again = run(post(server.url + "/v1/completions", body))[1]["choices"][0]["text"]
    assert first == again
    with SimProcess(["--seed", "3", "--served-model-name", "tiny"], tmp_path / "same.log") as same:
        assert run(post(same.url + "/v1/completions", body))[1]["choices"][0]["text"] == first
    with SimProcess(["--seed", "4"], tmp_path / "other.log") as other:
        assert run(post(other.url + "/v1/completions", body))[1]["choices"][0]["text"] != first


def test_metrics_names_labels_and_counters(server) -> None:
    status, text = server.get("/metrics")
    assert status == 200
    for name in METRIC_NAMES:
        assert re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ", text, re.M), name
    for line in text.splitlines():
        if line.startswith("vllm:") and "{" in line:
            assert 'model_name="tiny"' in line and 'engine="0"' in line, line
    before = server.metrics()
    results = load(server.url, concurrency=6, duration_s=1.5, max_tokens=20, prompt_words=30)
    assert results and all(r["status"] == 200 and not r["error"] for r in results)
    after = server.metrics()
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 20 * len(results)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 31 * len(results)
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == len(results)
    assert after["vllm:iteration_tokens_total_count"] > before["vllm:iteration_tokens_total_count"]
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] \
        == len(results)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


def test_stats_line_format_and_fall_to_silence(server) -> None:
    """VLLM_LOG_STATS_INTERVAL=1: lines under load; once idle, one zero line, then silence at INFO."""
    load(server.url, concurrency=4, duration_s=2.5, max_tokens=16)
    time.sleep(3.5)
    lines = [ln for ln in server.log().splitlines() if "Avg prompt throughput" in ln]
    assert lines
    for ln in lines:
        assert STATS_LINE.match(ln), ln
    busy = [i for i, ln in enumerate(lines) if "Avg generation throughput: 0.0" not in ln]
    assert busy
    after_busy = lines[busy[-1] + 1:]
    assert len(after_busy) == 1 and "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0" \
        in after_busy[0]
    n = len(lines)
    time.sleep(2.5)
    assert len([ln for ln in server.log().splitlines() if "Avg prompt throughput" in ln]) == n


def test_access_log_lines(server) -> None:
    server.get("/health")
    assert re.search(r'^\(APIServer pid=\d+\) INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK$',
                     server.log(), re.M)
    assert "Application startup complete." in server.log()


def test_spec_decode_metrics_and_preemptions(tmp_path) -> None:
    args = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}', "--num-gpu-blocks-override",
            "24", "--max-model-len", "256"]
    with SimProcess(args, tmp_path / "spec.log", env={"VLLM_LOG_STATS_INTERVAL": "1"}) as sp:
        results = load(sp.url, concurrency=8, duration_s=2.0, max_tokens=40, prompt_words=30)
        assert results and all(r["tokens"] == 40 for r in results)
        time.sleep(1.2)
        m = sp.metrics()
        assert m["vllm:spec_decode_num_drafts_total"] > 0
        assert 0 < m["vllm:spec_decode_num_accepted_tokens_total"] < m["vllm:spec_decode_num_draft_tokens_total"]
        assert m["vllm:num_preemptions_total"] > 0
        log = sp.log()
        assert "SpecDecoding metrics: Mean acceptance length:" in log
        assert re.search(r"Waiting: \d+ reqs, Preemptions: \d+, GPU KV cache usage", log)


def test_process_tree_like_vllm_and_sigterm_leaves_nothing(tmp_path) -> None:
    sp = SimProcess(["-tp", "4"], tmp_path / "tp.log").start()
    try:
        names = sorted(p.name() for p in sp.tree[1:])
        assert names == ["VLLM::EngineCore", "VLLM::Worker_TP0", "VLLM::Worker_TP1", "VLLM::Worker_TP2",
                         "VLLM::Worker_TP3"]
        core = next(p for p in sp.tree if p.name() == "VLLM::EngineCore")
        assert core.ppid() == sp.proc.pid
        assert all(p.cmdline()[0].startswith("VLLM::") for p in sp.tree[1:])
        pgid = sp.proc.pid
        assert all(os.getpgid(p.pid) == pgid for p in sp.tree)      # one process group, as the launcher expects
        load(sp.url, concurrency=2, duration_s=0.5, max_tokens=8)
        assert sp.stop() == 0
        assert not sp.leftover
        assert not [p for p in sp.tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        sp.stop()       # a failed check above leaves no server behind (a clean-clone run's did)


def test_children_die_with_a_killed_api_server(tmp_path) -> None:
    sp = SimProcess(["-tp", "2"], tmp_path / "kill.log").start()
    try:
        children = sp.tree[1:]
        sp.proc.kill()
        sp.proc.wait(timeout=5)
        gone, alive = psutil.wait_procs(children, timeout=5)
        assert not alive
    finally:
        sp.stop()


def test_port_in_use_fails_fast(server, tmp_path) -> None:
    sp = SimProcess([], tmp_path / "busy.log", port=server.port)
    try:
        sp.start(ready_timeout=5)          # /health answers: the other server's
    except RuntimeError:
        pass
    assert sp.proc.wait(timeout=20) == 1
    sp.stop()
    assert "Address already in use" in sp.log()
    assert server.health() == 200
