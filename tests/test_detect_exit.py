"""The exit detector."""

from soakmatrix.jobs.detect.exit import ExitDetector
from soakmatrix.jobs.detect.protocol import Tick


def test_running_process_is_quiet():
    assert ExitDetector().observe(Tick(now=1.0, exit_code=None)) is None


def test_exit_is_a_crash_naming_the_code_or_signal():
    v = ExitDetector().observe(Tick(now=3.0, exit_code=1))
    assert v.kind == "crash" and v.detector == "exit" and "exit code 1" in v.message
    assert "signal 9" in ExitDetector().observe(Tick(now=3.0, exit_code=-9)).message
