"""The simulated engine core in-process: batching, chunked prefill, prefix cache, preemption, step times."""

from __future__ import annotations

import random

import pytest

from soakmatrix.jobs.sim.args import parse_sim_argv
from soakmatrix.jobs.sim.clocks import Clocks
from soakmatrix.jobs.sim.executor import step_time_s
from soakmatrix.jobs.sim.scheduler import CoreRequest, Scheduler


def config(*argv: str):
    return parse_sim_argv(["m", *argv], environ={})


def request(i: int, prompt: list[int], max_tokens: int, seed: int = 0) -> CoreRequest:
    return CoreRequest(f"r{i}", prompt, max_tokens, random.Random(f"tok:{seed}:{i}"), random.Random(f"spec:{i}"))


def run_to_end(s: Scheduler, cfg, max_steps: int = 100_000) -> tuple[dict[str, list[int]], list]:
    out: dict[str, list[int]] = {}
    steps = []
    rng = random.Random(0)
    for _ in range(max_steps):
        if not s.has_work():
            break
        sched = s.schedule()
        steps.append((sched, step_time_s(cfg, sched, rng), len(s.running), len(s.waiting), s.stat_preempted))
        outputs, _, _ = s.update_from_output(sched, None)
        for rid, tokens, _finish in outputs:
            out.setdefault(rid, []).extend(tokens)
    return out, steps


def test_continuous_batching_respects_max_num_seqs() -> None:
    cfg = config("--max-num-seqs", "4")
    s = Scheduler(cfg, 8192)
    for i in range(10):
        s.add(request(i, list(range(40)), 8 + i))
    out, steps = run_to_end(s, cfg)
    assert max(r for _, _, r, _, _ in steps) == 4
    assert steps[0][3] == 6                      # six wait at first
    assert {k: len(v) for k, v in out.items()} == {f"r{i}": 8 + i for i in range(10)}
    # a finished request's slot is refilled in the following steps (continuous, not static, batching)
    assert any(r == 4 and w > 0 for _, _, r, w, _ in steps[10:])


def test_chunked_prefill_splits_a_long_prompt() -> None:
    cfg = config("--max-num-batched-tokens", "2048", "--max-model-len", "16384")
    s = Scheduler(cfg, 8192)
    s.add(request(0, list(range(5000)), 4))
    _, steps = run_to_end(s, cfg)
    prefill = [sched.total_tokens for sched, *_ in steps if sched.items[0].prefill]
    assert prefill == [2048, 2048, 904]


def test_without_chunking_a_long_prompt_is_one_slow_step() -> None:
    cfg = config("--no-enable-chunked-prefill", "--max-model-len", "8192")
    s = Scheduler(cfg, 8192)
    s.add(request(0, list(range(8000)), 4))
    _, steps = run_to_end(s, cfg)
    assert steps[0][0].total_tokens == 8000
    assert steps[0][1] > 2.0                       # a legitimately slow step: seconds
    assert all(t < 0.05 for _, t, *_ in steps[1:])  # decode steps: tens of ms


def test_step_time_grows_with_batch_and_prompt() -> None:
    cfg = config()

    def decode_time(batch: int) -> float:
        s = Scheduler(cfg, 8192)
        for i in range(batch):
            s.add(request(i, [1, 2, 3], 50))
        s.update_from_output(s.schedule(), None)      # prefill
        return step_time_s(cfg, s.schedule(), random.Random(1))

    t1, t64, t256 = decode_time(1), decode_time(64), decode_time(256)
    assert 0.005 < t1 < 0.02 and t1 < t64 < t256 < 0.2

    def prefill_time(n: int) -> float:
        s = Scheduler(cfg, 8192)
        s.add(request(0, list(range(n)), 1))
        return step_time_s(cfg, s.schedule(), random.Random(1))

    assert prefill_time(100) < prefill_time(1000) < prefill_time(4000)


def test_eager_and_tp_change_step_time() -> None:
    def t(*argv: str) -> float:
        cfg = config(*argv)
        s = Scheduler(cfg, 8192)
        for i in range(32):
            s.add(request(i, [1, 2, 3], 5))
        s.update_from_output(s.schedule(), None)
        return step_time_s(cfg, s.schedule(), random.Random(1))

    assert t("--enforce-eager") > t() > t("-tp", "4")


def test_prefix_cache_hits_shared_prefixes() -> None:
    prefix = list(range(1000, 1064))              # four full blocks
    for caching, expect_hits in (("--enable-prefix-caching", 64), ("--no-enable-prefix-caching", 0)):
        cfg = config(caching)
        s = Scheduler(cfg, 8192)
        s.add(request(0, prefix + [1, 2, 3], 2))
        run_to_end(s, cfg)
        s.add(request(1, prefix + [7, 8, 9], 2))
        sched = s.schedule()
        assert s.stat_prefix_hits == expect_hits
        assert s.stat_prefix_queries == 67
        assert sched.total_tokens == 67 - expect_hits     # cached tokens are not computed again


def test_full_kv_cache_preempts_and_every_request_still_finishes() -> None:
    cfg = config("--max-num-seqs", "16")
    s = Scheduler(cfg, num_gpu_blocks=40)           # 640 tokens for 16 requests of up to 100
    for i in range(16):
        s.add(request(i, list(range(i, i + 40)), 60))
    out, steps = run_to_end(s, cfg)
    assert sum(p for *_, p in steps) > 0
    assert {k: len(v) for k, v in out.items()} == {f"r{i}": 60 for i in range(16)}
    assert s.free_blocks == 40


def test_speculative_decoding_keeps_exact_token_counts() -> None:
    cfg = config("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')
    s = Scheduler(cfg, 8192)
    for i in range(5):
        s.add(request(i, [1, 2, 3, 4], 37))
    spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_pos": [0, 0, 0]}
    out = {}
    while s.has_work():
        outputs, _, _ = s.update_from_output(s.schedule(), spec)
        for rid, tokens, _f in outputs:
            out.setdefault(rid, []).extend(tokens)
    assert all(len(v) == 37 for v in out.values())
    assert spec["drafts"] > 0 and 0 < spec["accepted"] < spec["draft_tokens"]
    assert spec["accepted_pos"][0] >= spec["accepted_pos"][1] >= spec["accepted_pos"][2]


def test_tokens_are_deterministic_for_a_seed() -> None:
    def tokens(seed: int, batch: int) -> list[int]:
        cfg = config()
        s = Scheduler(cfg, 8192)
        for i in range(batch):
            s.add(request(i, [5, 6, 7], 20, seed=seed))
        out, _ = run_to_end(s, cfg)
        return out["r0"]

    assert tokens(1, 1) == tokens(1, 8)           # batching does not change a request's tokens
    assert tokens(1, 1) != tokens(2, 1)


def test_clocks_scale_with_a_floor_for_the_stats_line(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "10")
    monkeypatch.delenv("VLLM_RINGBUFFER_WARNING_INTERVAL", raising=False)
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    c = Clocks.from_env(120.0)
    assert c.ring_warning_s == pytest.approx(0.5)
    # 300/120 s would leave a soak job 2 s to find the stuck engine alive: it lives longer past its first warning
    assert c.rpc_timeout_s == pytest.approx(0.5 + Clocks.EVIDENCE_WINDOW_S)
    assert c.stats_interval_s == 0.5                      # 10/120 floored
    assert Clocks.from_env(1.0).stats_interval_s == 10.0
    assert Clocks.from_env(4.0).rpc_timeout_s == 75.0
    assert Clocks.from_env(30.0).rpc_timeout_s == pytest.approx(2.0 + Clocks.EVIDENCE_WINDOW_S)
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "2")
    assert Clocks.from_env(1.0).rpc_timeout_s == 2.0      # never longer than vLLM's own timeout
