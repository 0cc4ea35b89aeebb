"""What the simulated API server reports about its engine: vLLM's Prometheus metrics and stats line.

`Metrics` holds vLLM 0.33's metrics (names, types, labels, `prometheus_client`) for `/metrics`;
`StatLogger` writes the periodic `Engine 000: Avg prompt throughput: ...` line. Both are fed only
from the engine core's step outputs (`engine_client.py`), so when the core hangs they freeze
exactly as vLLM's do.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .proc import vlog


class Metrics:
    """vLLM 0.33's Prometheus metrics (names, types, labels `model_name` and `engine`)."""

    def __init__(self, model_name: str, spec: bool) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": "0"}

        def g(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(**values)

        def c(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**values)

        def h(name: str, doc: str, buckets: Sequence[float]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**values)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = c(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=r,
        )
        for reason in ("stop", "length", "abort"):
            self._success.labels(finished_reason=reason, **values)
        self._values = values
        self.iteration_tokens = h(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
        )
        self.ttft = h(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            [
                0.001,
                0.005,
                0.01,
                0.02,
                0.04,
                0.06,
                0.08,
                0.1,
                0.25,
                0.5,
                0.75,
                1.0,
                2.5,
                5.0,
                7.5,
                10.0,
                20.0,
                40.0,
                80.0,
                160.0,
                640.0,
                2560.0,
            ],
        )
        self.itl = h(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
        )
        self.e2e = h(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            [
                0.3,
                0.5,
                0.8,
                1.0,
                1.5,
                2.0,
                2.5,
                5.0,
                10.0,
                15.0,
                20.0,
                30.0,
                40.0,
                50.0,
                60.0,
                120.0,
                240.0,
                480.0,
                960.0,
                1920.0,
                7680.0,
            ],
        )
        token_buckets = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
        self.request_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.request_generation = h(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.spec = spec
        if spec:
            self.spec_drafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_draft_tokens = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_accepted = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            self._spec_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels + ["position"],
                registry=r,
            )

    def success(self, reason: str) -> None:
        self._success.labels(finished_reason=reason, **self._values).inc()

    def spec_pos(self, pos: int, n: int) -> None:
        self._spec_pos.labels(position=str(pos), **self._values).inc(n)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


@dataclass
class _SpecTotals:
    """Speculative decoding since the last log line."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_pos: list[int] = field(default_factory=list)  # acceptances at each draft position


class StatLogger:
    """vLLM's `LoggingStatLogger`: the `Engine 000: Avg prompt throughput: ...` line."""

    def __init__(self) -> None:
        self.num_prompt = 0
        self.num_generation = 0
        self.num_preemptions = 0
        self.last_log = time.monotonic()
        self.last_prompt_tp = 0.0
        self.last_generation_tp = 0.0
        self.running = 0
        self.waiting = 0
        self.kv = 0.0
        self.prefix: deque[tuple[int, int, int]] = deque()  # (requests, queries, hits), last 1000 requests
        self.prefix_totals = [0, 0, 0]
        self.spec = _SpecTotals()

    def observe(self, step: dict[str, Any]) -> None:
        self.num_prompt += step["prompt_tokens"]
        self.num_generation += step["gen_tokens"]
        self.num_preemptions += step["preempted"]
        self.running, self.waiting, self.kv = step["running"], step["waiting"], step["kv"]
        if step["prefix_requests"]:
            entry = (step["prefix_requests"], step["prefix_queries"], step["prefix_hits"])
            self.prefix.append(entry)
            for i in range(3):
                self.prefix_totals[i] += entry[i]
            while self.prefix_totals[0] > 1000 and len(self.prefix) > 1:
                old = self.prefix.popleft()
                for i in range(3):
                    self.prefix_totals[i] -= old[i]
        spec = step.get("spec")
        if spec:
            self.spec.drafts += spec["drafts"]
            self.spec.draft_tokens += spec["draft_tokens"]
            self.spec.accepted += spec["accepted"]
            pos = self.spec.accepted_pos
            pos.extend([0] * (len(spec["accepted_pos"]) - len(pos)))
            for i, n in enumerate(spec["accepted_pos"]):
                pos[i] += n

    def hit_rate(self) -> float:
        q = self.prefix_totals[1]
        return self.prefix_totals[2] / q if q else 0.0

    def log(self) -> None:
        now = time.monotonic()
        elapsed = max(1e-9, now - self.last_log)
        prompt_tp = self.num_prompt / elapsed
        generation_tp = self.num_generation / elapsed
        idle = not any((prompt_tp, generation_tp, self.last_prompt_tp, self.last_generation_tp))
        level = logging.DEBUG if idle else logging.INFO
        self.last_prompt_tp, self.last_generation_tp = prompt_tp, generation_tp
        parts = [
            "Avg prompt throughput: %.1f tokens/s",
            "Avg generation throughput: %.1f tokens/s",
            "Running: %d reqs",
            "Waiting: %d reqs",
        ]
        args: list[Any] = [prompt_tp, generation_tp, self.running, self.waiting]
        if self.num_preemptions > 0:
            parts.append("Preemptions: %d")
            args.append(self.num_preemptions)
        parts += ["GPU KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%"]
        args += [self.kv * 100, self.hit_rate() * 100]
        vlog(level, "loggers.py:257", "Engine 000: " + ", ".join(parts), *args)
        s = self.spec
        if s.drafts:
            rates = ", ".join(f"{n / s.drafts:.3f}" for n in s.accepted_pos)
            vlog(
                level,
                "metrics.py:96",
                "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
                "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
                "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
                1 + s.accepted / s.drafts,
                s.accepted / elapsed,
                s.draft_tokens / elapsed,
                s.accepted,
                s.draft_tokens,
                rates,
                100.0 * s.accepted / s.draft_tokens if s.draft_tokens else 0.0,
            )
        self.num_prompt = self.num_generation = self.num_preemptions = 0
        self.spec = _SpecTotals()
        self.last_log = now
