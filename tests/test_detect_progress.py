"""The progress detector on recorded metric series (no server, no clock)."""

from soakmatrix.jobs.detect.progress import ProgressDetector, parse_metrics
from soakmatrix.jobs.detect.protocol import MetricsSample, Tick, StreamState

VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 12345.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 999.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="tiny"} 70.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 70.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 13344.0
"""


def test_parse_metrics_reads_vllm_names_with_labels():
    s = parse_metrics(VLLM_TEXT, at=5.0, elapsed_s=0.2)
    assert (s.generation_tokens, s.prompt_tokens, s.running, s.waiting, s.steps) == (12345, 999, 9, 2, 70)
    assert s.at == 5.0 and s.elapsed_s == 0.2


def test_parse_metrics_sums_engines():
    text = VLLM_TEXT + 'vllm:generation_tokens_total{engine="1",model_name="tiny"} 5.0\n'
    # a second sample of an already-declared family is part of the same family
    assert parse_metrics(text, at=0).generation_tokens == 12350


def feed(det, series, stream=None):
    """series: (t, tokens, running) triples, one scrape each; returns the first verdict."""
    for t, tokens, running in series:
        v = det.observe(Tick(now=t, metrics=MetricsSample(at=t, generation_tokens=tokens,
                                                                 prompt_tokens=0, running=running, waiting=0),
                                    stream=stream(t) if stream else None))
        if v:
            return v
    return None


def test_steady_progress_is_not_a_hang():
    series = [(t, 10 * t, 8) for t in range(120)]
    assert feed(ProgressDetector(), series) is None


def test_tokens_flat_with_requests_running_is_a_hang_dated_to_the_last_progress():
    series = [(t, 10 * t, 8) for t in range(30)] + [(t, 290, 8) for t in range(30, 60)]
    v = feed(ProgressDetector(floor_s=6), series)
    assert v is not None and v.detector == "progress" and v.kind == "hang"
    assert v.since == 29                       # the first scrape that saw the final count
    assert 6 < v.at - v.since <= 8             # fired just past the threshold, not later
    assert "flat at 290" in v.message and "8 requests running" in v.message


def test_flat_tokens_while_idle_is_not_a_hang():
    series = [(t, 10 * t, 4) for t in range(10)] + [(t, 90, 0) for t in range(10, 100)]
    assert feed(ProgressDetector(), series) is None


def test_idle_period_does_not_count_towards_a_stall_once_busy_again():
    # idle for a minute, then requests arrive and tokens flow after 3 s: no alarm
    series = ([(t, 50, 0) for t in range(0, 60)] + [(t, 50, 2) for t in range(60, 63)]
              + [(t, 50 + 10 * (t - 62), 2) for t in range(63, 80)])
    assert feed(ProgressDetector(floor_s=6), series) is None


def test_failed_scrapes_carry_no_information():
    det = ProgressDetector(floor_s=6)
    assert feed(det, [(t, 10 * t, 8) for t in range(5)]) is None
    for t in range(5, 40):   # the API server is too busy to answer /metrics
        assert det.observe(Tick(now=t, metrics=None, scrape_error="timeout")) is None
    # tokens moved meanwhile: the next answered scrape shows progress
    assert feed(det, [(40, 400, 8), (41, 410, 8)]) is None


def test_slow_scrapes_raise_the_threshold():
    # scrapes answer every 5 s (the CPU build under load): gaps of 5 s are normal
    det = ProgressDetector(floor_s=6, factor=2, ceiling_s=15)
    series = [(t, t * 10, 8) for t in range(0, 100, 5)]
    assert feed(det, series) is None
    assert det.threshold.base == 10


def test_a_waiting_long_prompt_extends_the_threshold():
    det = ProgressDetector(floor_s=6, prefill_s_per_token=0.001, prefill_factor=1.0)
    stream = lambda t: StreamState(at=t, open_streams=3, last_token_at=10, waiting_first_token_prompt_len=8000)
    # 8000 tokens at 1 ms each: 8 s more than the 6 s floor
    series = [(t, 10 * t, 3) for t in range(11)] + [(t, 100, 3) for t in range(11, 24)]
    assert feed(det, series, stream) is None
    v = feed(det, [(t, 100, 3) for t in range(24, 40)], stream)
    assert v is not None and v.details["threshold_s"] == 14
