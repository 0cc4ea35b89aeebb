"""Load shapes (pure) and the load driver against a small streaming server of our own."""

import random
import time

import pytest
from tests.fake_openai import serve_in_thread

from soakmatrix.jobs.load import LoadDriver
from soakmatrix.jobs.load_shapes import Arrivals, RequestSource, is_open_loop, target_concurrency, trickle_bursts
from soakmatrix.matrix.contracts.workloads import Workload, params_of


def workload(kind, **params):
    defaults = {k: d for k, (_, d) in params_of(kind).items()}
    return Workload(f"{kind}-test", kind, {**defaults, **params})


def test_random_requests_are_seeded_and_stagger_over_the_whole_range():
    w = workload("random", input_len=[10, 100], output_len=[5, 50])
    src1, src2, other = (RequestSource("random", w.params, s) for s in (3, 3, 4))
    one = [src1.next() for _ in range(200)]
    assert one == [src2.next() for _ in range(200)]
    assert one != [other.next() for _ in range(200)]
    outs = {r.max_tokens for r in one}
    assert min(outs) <= 8 and max(outs) >= 47        # range ratio 0: lengths spread across the range
    assert all(10 <= len(r.prompt.split()) <= 100 for r in one)


def test_chat_sessions_share_a_prefix_and_resend_their_history():
    w = workload("chat", sessions=2, turns=3, shared_prefix_len=50, input_len=[5, 5])
    src = RequestSource("chat", w.params, seed=1)
    seen = []
    for _ in range(12):
        r = src.next()
        assert r.api == "chat" and r.messages[0]["role"] == "system"
        assert len(r.messages[0]["content"].split()) == 50
        src.answered(r, "reply words")
        seen.append(r)
    systems = {r.messages[0]["content"] for r in seen}
    assert len(systems) == 1                          # one shared prefix for every session
    assert max(r.turn for r in seen) == 3             # histories grow up to `turns` and start over
    later = [r for r in seen if r.turn == 2][0]
    assert later.messages[2]["role"] == "assistant"   # the previous answer is resent


def test_ramp_moves_from_concurrency_to_peak_with_spikes():
    p = workload("ramp", concurrency=2, peak=10, ramp_s=100, spike_every_s=30, spike_len_s=5).params
    assert target_concurrency("ramp", p, 0) == 2
    assert target_concurrency("ramp", p, 50) == 6
    assert target_concurrency("ramp", p, 31) == 10    # inside a spike
    assert target_concurrency("ramp", p, 200) == 10
    assert target_concurrency("random", {"concurrency": 7}, 50) == 7


def test_trickle_is_idle_gaps_then_bursts_of_zero_to_max():
    p = workload("trickle", idle_s=30, max_burst=2, burst_every_s=5).params
    bursts = []
    for b in trickle_bursts(p, random.Random(0)):
        if b.at > 200:
            break
        bursts.append(b)
    assert bursts[0].at == 30                          # nothing before the first idle gap ends
    assert all(0 <= b.count <= 2 for b in bursts) and {0, 1, 2} <= {b.count for b in bursts}
    gaps = [b2.at - b1.at for b1, b2 in zip(bursts, bursts[1:])]
    assert max(gaps) >= 30 and min(gaps) == 5
    assert is_open_loop("trickle", p)


def test_open_loop_arrivals_are_poisson_at_the_rate():
    p = workload("random", loop="open", rate=4.0).params
    times = []
    for t in Arrivals("random", p, seed=5):
        if t > 250:
            break
        times.append(t)
    assert 900 < len(times) < 1100                   # 4/s for 250 s, within a few sigma
    assert times == sorted(times)


@pytest.fixture
def server():
    engine, stop = serve_in_thread(step_s=0.01)
    yield f"http://127.0.0.1:{engine.port}", engine
    stop.set()


@pytest.mark.slow
def test_closed_loop_driver_is_bounded_and_records_ttft_and_gaps(server):
    url, engine = server
    w = workload("random", concurrency=4, input_len=[5, 20], output_len=[5, 20], max_requests=30)
    drv = LoadDriver(url, w, seed=1, duration_s=60).start()
    deadline = time.monotonic() + 60
    while not drv.finished and time.monotonic() < deadline:
        time.sleep(0.1)
    drv.stop()
    s = drv.stats.summary()
    assert drv.finished and s["sent"] == 30 and s["completed"] == 30 and s["failed"] == 0
    assert s["tokens"] == engine.gen._value.get()      # the server's count and the client's agree
    assert 5 * 30 <= s["tokens"] <= 20 * 30
    assert s["ttft_p50_s"] is not None and s["gap_p50_s"] is not None and s["gap_max_s"] > 0


@pytest.mark.slow
def test_chat_open_loop_and_non_streaming(server):
    url, _ = server
    w = workload("chat", loop="open", rate=20.0, input_len=[3, 5], output_len=[3, 5], sessions=4, turns=2,
                 shared_prefix_len=10, max_requests=15, stream=False)
    drv = LoadDriver(url, w, seed=2, duration_s=30).start()
    deadline = time.monotonic() + 60
    while not drv.finished and time.monotonic() < deadline:
        time.sleep(0.1)
    drv.stop()
    s = drv.stats.summary()
    assert s["completed"] == 15 and s["failed"] == 0 and s["tokens"] >= 45


@pytest.mark.slow
def test_stop_abandons_requests_to_a_hung_server_promptly():
    engine, stop = serve_in_thread(step_s=0.01, hang_after_s=0.5)
    port = engine.port
    try:
        w = workload("random", concurrency=3, input_len=[5, 5], output_len=[500, 500])
        drv = LoadDriver(f"http://127.0.0.1:{port}", w, seed=0, duration_s=60).start()
        time.sleep(2.0)
        snap = drv.snapshot()
        assert snap.open_streams == 3 and snap.last_token_at is not None
        t0 = time.monotonic()
        drv.stop(timeout_s=10)
        assert drv.finished and time.monotonic() - t0 < 10
    finally:
        stop.set()


@pytest.mark.slow
def test_failures_in_a_row_are_counted_and_reset_by_a_success():
    engine, stop = serve_in_thread(step_s=0.01, hang_after_s=1.0, hang_style="error")
    try:
        w = workload("random", concurrency=2, input_len=[5, 5], output_len=[5, 10])
        drv = LoadDriver(f"http://127.0.0.1:{engine.port}", w, seed=0, duration_s=4).start()
        time.sleep(4.5)
        snap = drv.snapshot()
        drv.stop()
    finally:
        stop.set()
    assert drv.stats.completed > 0 and snap.consecutive_failures >= 5 and snap.last_error == "http 500"
