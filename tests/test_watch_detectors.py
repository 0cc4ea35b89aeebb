"""The passive detectors: waiting-only is not load; a canary behind moving counters is not stuck."""

from soakmatrix.jobs.detect.protocol import DETECTORS, MetricsSample, StreamState, Tick
from soakmatrix.jobs.watch.detectors import CanaryStreamDetector, PassiveProgressDetector, build_watch_detectors


def sample(t, gen, running=0, waiting=0, steps=0):
    return MetricsSample(at=t, generation_tokens=gen, prompt_tokens=0, running=running, waiting=waiting, steps=steps)


def test_registered_and_sharing_one_threshold():
    dets = build_watch_detectors()
    assert {"passive_progress", "canary"} <= set(DETECTORS)
    progress, canary = dets[0], dets[1]
    assert progress.threshold is canary.threshold
    assert progress.threshold.ceiling_s == 30.0 and progress.threshold.floor_s == 6.0
    assert dets[3].max_in_a_row == 3


def test_waiting_with_nothing_running_is_not_load():
    d = PassiveProgressDetector()
    assert all(d.observe(Tick(now=t, metrics=sample(t, 10, running=0, waiting=7))) is None for t in range(100))


def test_running_with_flat_counters_is_a_hang():
    d = PassiveProgressDetector()
    verdicts = [d.observe(Tick(now=t, metrics=sample(t, 10, running=2))) for t in range(1000, 1020)]
    first = next(i for i, v in enumerate(verdicts) if v is not None)
    assert first == 7 and verdicts[first].detector == "passive_progress"


def test_canary_waits_while_server_counters_move():
    d = CanaryStreamDetector(floor_s=6.0, ceiling_s=30.0)
    out = []
    for t in range(60):
        s = StreamState(at=t, open_streams=1, oldest_waiting_first_token_since=0.0)
        out.append(d.observe(Tick(now=t, metrics=sample(t, 0, running=1, steps=t // 4), stream=s)))
    assert not any(out)


def test_silent_canary_with_frozen_server_fires():
    d = CanaryStreamDetector(floor_s=6.0)
    out = [d.observe(Tick(now=t, metrics=sample(t, 5), stream=StreamState(at=t, open_streams=1,
                                                                           oldest_waiting_first_token_since=0.0)))
           for t in range(10)]
    assert out[6] is None and out[7] is not None and "before its first token" in out[7].message


def test_new_canary_is_timed_from_its_own_start():
    d = CanaryStreamDetector(floor_s=6.0)
    # a first canary got a token at t=1; the next one starts at t=10 and waits: its silence starts at 10
    d.observe(Tick(now=1, stream=StreamState(at=1, open_streams=1, last_token_at=1.0)))
    out = [d.observe(Tick(now=t, stream=StreamState(at=t, open_streams=1, last_token_at=1.0,
                                                     oldest_waiting_first_token_since=10.0)))
           for t in range(10, 17)]
    assert not any(out)
