"""A hang verdict stands only if no token reaches the client until the confirmation window closes."""

from soakmatrix.jobs.detect.protocol import HangVerdict, StreamState
from soakmatrix.jobs.hang_confirmation import ConfirmationWindow, confirm, needs_confirmation, progressed_since


def verdict(at=100.0, kind="hang"):
    return HangVerdict(detector="stream", kind=kind, at=at, since=at - 6, message="no token for 6 s")


class FakeTime:
    def __init__(self, now):
        self.now = now
        self.slept = 0.0

    def clock(self):
        return self.now

    def sleep(self, s):
        self.now += s
        self.slept += s


def stream_with_token_at(at):
    return lambda: StreamState(at=0.0, open_streams=4, last_token_at=at)


def test_only_a_token_after_the_verdict_is_progress():
    v = verdict(at=100.0)
    assert not progressed_since(v, None)
    assert not progressed_since(v, StreamState(at=101.0, open_streams=4, last_token_at=None))
    assert not progressed_since(v, StreamState(at=101.0, open_streams=4, last_token_at=94.0))
    assert not progressed_since(v, StreamState(at=101.0, open_streams=4, last_token_at=100.0))
    assert progressed_since(v, StreamState(at=101.0, open_streams=4, last_token_at=100.5))


def test_a_hang_stands_when_the_window_closes_without_a_token():
    t = FakeTime(now=101.0)      # the evidence took a second
    assert confirm(verdict(at=100.0), stream_with_token_at(94.0), evidence_done_at=101.0,
                   window=ConfirmationWindow(after_verdict_s=3, after_evidence_s=1), clock=t.clock, sleep=t.sleep)
    assert t.now >= 103.0        # three seconds after the verdict


def test_slow_evidence_extends_the_window_past_the_dumps():
    t = FakeTime(now=110.0)      # the dumps took ten seconds (they pause the engine)
    assert confirm(verdict(at=100.0), stream_with_token_at(94.0), evidence_done_at=110.0,
                   window=ConfirmationWindow(after_verdict_s=3, after_evidence_s=1), clock=t.clock, sleep=t.sleep)
    assert 111.0 <= t.now < 111.5


def test_a_token_inside_the_window_ends_it_at_once_as_a_stall():
    t = FakeTime(now=101.0)
    tokens = iter([None, None, 101.25])

    def snapshot():
        return StreamState(at=t.now, open_streams=4, last_token_at=next(tokens, 101.25) or 94.0)

    assert not confirm(verdict(at=100.0), snapshot, evidence_done_at=101.0,
                       window=ConfirmationWindow(after_verdict_s=3, after_evidence_s=1), clock=t.clock, sleep=t.sleep)
    assert t.now < 102.0


def test_crashes_are_not_confirmed_hangs_are():
    assert needs_confirmation(verdict(kind="hang"))
    assert not needs_confirmation(verdict(kind="crash"))
