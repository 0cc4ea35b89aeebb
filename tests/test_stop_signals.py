"""StopSignals: SIGINT, SIGTERM and a terminal's SIGHUP end a run cleanly; nohup's SIGHUP stays ignored."""

from __future__ import annotations

import os
import signal
import time

import pytest

from soakmatrix.matrix.stop_signals import Stopped, StopSignals


def _deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.2)          # the handler runs in the main thread at the next bytecode


@pytest.fixture
def sighup_at_its_default():
    """SIGHUP as a terminal's session has it: a suite started under `nohup` (or a CI runner that
    ignores it) hands it down ignored, and StopSignals rightly leaves an ignored SIGHUP alone."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, before)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_each_stop_signal_raises_stopped_and_names_its_exit_code(signum, code, sighup_at_its_default):
    with StopSignals() as stop:
        with pytest.raises(Stopped) as caught:
            _deliver(signum)
    assert caught.value.signum == signum and stop.exit_code() == code


def test_a_sighup_ignored_at_start_as_nohup_leaves_it_stays_ignored_and_is_put_back():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            stop.install()             # installed again once Ray is up: still nohup's choice
            _deliver(signal.SIGHUP)    # no Stopped: the run goes on
            assert stop.received is None
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_the_handlers_before_are_put_back_on_exit(sighup_at_its_default):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with StopSignals():
        pass
    assert {s: signal.getsignal(s) for s in before} == before
