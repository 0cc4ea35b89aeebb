"""The errors detector: every request failing is a dead engine, not a pass."""

from soakmatrix.jobs.detect.errors import ErrorsDetector
from soakmatrix.jobs.detect.protocol import Tick, StreamState


def observe(n, last="http 500"):
    return ErrorsDetector(max_in_a_row=20).observe(
        Tick(now=9.0, stream=StreamState(at=9.0, consecutive_failures=n, last_error=last, last_token_at=4.0)))


def test_a_run_of_server_errors_is_a_crash():
    v = observe(20)
    assert v.kind == "crash" and v.detector == "errors" and v.since == 4.0 and "20 requests in a row" in v.message


def test_a_few_errors_or_timeouts_are_not():
    assert observe(19) is None
    assert observe(50, last="timeout") is None     # a hang's symptom: the stall detectors decide
