"""The client-side stream stall detector on recorded stream states."""

from soakmatrix.jobs.detect.protocol import Tick, StreamState
from soakmatrix.jobs.detect.stream import StreamDetector


def run(det, states):
    for s in states:
        v = det.observe(Tick(now=s.at, stream=s))
        if v:
            return v
    return None


def flowing(t0, t1, step=0.5, streams=4, waiting=0):
    return [StreamState(at=t0 + i * step, open_streams=streams, last_token_at=t0 + i * step,
                        waiting_first_token_prompt_len=waiting)
            for i in range(int((t1 - t0) / step))]


def silent(t0, t1, last, step=0.5, streams=4, waiting=0):
    return [StreamState(at=t0 + i * step, open_streams=streams, last_token_at=last,
                        waiting_first_token_prompt_len=waiting)
            for i in range(int((t1 - t0) / step))]


def test_tokens_flowing_is_quiet():
    assert run(StreamDetector(), flowing(0, 120)) is None


def test_silence_with_open_streams_is_a_hang():
    v = run(StreamDetector(floor_s=6), flowing(0, 20) + silent(20, 60, last=19.5))
    assert v is not None and v.detector == "stream" and v.since == 19.5
    assert 6 < v.at - v.since < 7
    assert "4 open streams" in v.message


def test_no_open_streams_is_never_a_hang():
    idle = [StreamState(at=t, open_streams=0, last_token_at=5.0) for t in range(10, 200)]
    assert run(StreamDetector(), flowing(0, 10) + idle) is None


def test_a_long_prefill_is_not_a_hang_and_the_rate_is_learned():
    det = StreamDetector(floor_s=6, prefill_s_per_token=0.0005, prefill_factor=1.25)
    # a 16k-token prompt waits for its first token: every stream is held 9 s by its prefill
    states = (flowing(0, 10) + silent(10, 19, last=9.5, waiting=16000)
              + flowing(19, 40))
    assert run(det, states) is None
    assert det.threshold.seconds_per_prompt_token > 0.0005   # learned from the 9 s gap
    # the same silence without a waiting prompt is a hang
    assert run(StreamDetector(floor_s=6), flowing(0, 10) + silent(10, 19, last=9.5)) is not None


def test_learned_decode_gaps_raise_the_base_up_to_the_ceiling():
    det = StreamDetector(floor_s=2, factor=2, ceiling_s=5)
    states = flowing(0, 5) + silent(5, 7, last=4.5) + flowing(7, 20)  # a 2.5 s gap, explained by nothing
    assert run(det, states) is None
    assert det.threshold.base == 5    # 2 x 2.5, capped by the ceiling
