"""A build bisection's probes in the probe journal (`matrix/build_bisect/journal.py`): killed midway,
it resumes to the uninterrupted answer, a crash and an untestable build included."""

from __future__ import annotations

import pytest

from soakmatrix.matrix.bisect.journal import JournalingOracle, ProbeJournal
from soakmatrix.matrix.build_bisect import BuildSettings, bisect_builds, to_json
from soakmatrix.matrix.build_bisect.journal import BUILD_CODEC
from tests.test_build_bisect import SIG, ScriptedOracle, names

N, CHANGE_POINT = 40, 23
SETTINGS = BuildSettings(signature=SIG)


class DiesAt:
    """`inner` until batch `crash_at` is asked: then the driver dies."""

    def __init__(self, inner, crash_at):
        self.inner, self.crash_at, self.asked = inner, crash_at, 0

    def run(self, probes):
        if self.asked == self.crash_at:
            raise KeyboardInterrupt("the driver dies")
        self.asked += 1
        return self.inner.run(probes)


def scripted():
    # untestable builds and another signature's early hang: every kind of answer goes through the file
    return ScriptedOracle(CHANGE_POINT, untestable={5}, other_at=900.0)


def test_a_build_bisection_killed_midway_resumes_to_the_same_first_bad_build(tmp_path):
    expected = bisect_builds(names(N), scripted(), SETTINGS)
    assert expected.status == "found" and expected.first_bad == CHANGE_POINT
    path, header = tmp_path / "journal-builds.jsonl", {"kind": "builds", "builds": names(N)}
    first = scripted()
    with ProbeJournal(path, header, resume=False) as journal:
        with pytest.raises(KeyboardInterrupt):
            bisect_builds(names(N), JournalingOracle(DiesAt(first, 6), journal, BUILD_CODEC), SETTINGS)
    # the resumed run's oracle has seen the first six probes (the scripted builds' "first probe" state)
    with ProbeJournal(path, header, resume=True) as journal:
        oracle = JournalingOracle(first, journal, BUILD_CODEC)
        result = bisect_builds(names(N), oracle, SETTINGS)
    assert oracle.replayed == 6
    assert len(first.seen) == expected.probes        # no probe soaked twice
    assert to_json(result) == to_json(expected)



