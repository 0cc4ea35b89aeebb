"""Long probes soaked in pieces (`matrix/bisect/oracle_chunked.py`): the answer is the whole soak's,
each piece pays its start-up, and a driver that dies mid-probe resumes at the piece it was soaking."""

from __future__ import annotations

import pytest

from soakmatrix.matrix.bisect import Settings, bisect
from soakmatrix.matrix.bisect.journal import JournalingOracle, ProbeJournal
from soakmatrix.matrix.bisect.oracle import Probe, ProbeResult
from soakmatrix.matrix.bisect.oracle_chunked import ChunkedOracle
from soakmatrix.matrix.bisect.report import to_json
from soakmatrix.matrix.build_bisect.oracle import BUILD_PIECES, BuildProbe, BuildProbeResult
from tests.test_bisect import DeterministicOracle, elements, failing

HOUR = 3600.0
STARTUP = 600.0


class HangsAt:
    """Every probe hangs once `at_s` of load is reached over its pieces (per flags); counts its calls."""

    def __init__(self, at_s=None):
        self.at_s, self.asked, self.load = at_s, [], {}

    def run(self, probes):
        out = []
        for p in probes:
            self.asked.append(p)
            key = repr(sorted(p.flags.items()))
            before = self.load.get(key, 0.0)
            if self.at_s is not None and before + p.soak_s > self.at_s:
                t = self.at_s - before
                out.append(ProbeResult(p, "hang", "shm_broadcast_timeout", t, (STARTUP + t) / HOUR, "hang"))
            else:
                t = p.soak_s
                out.append(ProbeResult(p, "passed", None, t, (STARTUP + t) / HOUR, f"no hang in {t:.0f}s"))
            self.load[key] = before + t
        return out


def test_a_long_passing_probe_is_soaked_in_pieces_that_add_up():
    inner = HangsAt()
    probe = Probe({"mtp": 1}, 30 * HOUR, "failing cell")
    (r,) = ChunkedOracle(inner, 12 * HOUR).run([probe])
    assert [p.soak_s / HOUR for p in inner.asked] == [12, 12, 6]
    assert r.probe == probe and r.outcome == "passed" and r.exposure_s == 30 * HOUR
    assert r.gpu_hours == pytest.approx(3 * STARTUP / HOUR + 30)          # a start-up per piece
    assert r.extra["soaked_in_pieces"] == 3 and "3 pieces" in r.message


def test_a_hang_in_a_piece_ends_the_probe_with_the_load_before_it():
    inner = HangsAt(at_s=15 * HOUR)
    short = Probe({"mtp": 0}, 2 * HOUR)
    r, s = ChunkedOracle(inner, 12 * HOUR).run([Probe({"mtp": 1}, 30 * HOUR), short])
    assert r.outcome == "hang" and r.exposure_s == 15 * HOUR and r.signature == "shm_broadcast_timeout"
    assert [p.soak_s / HOUR for p in inner.asked] == [12, 2, 12]           # the pieces of one batch go together
    assert s is not None and s.probe == short and "soaked_in_pieces" not in s.extra   # short: as it was


def test_build_probes_are_cut_and_put_together_the_same_way():
    class Builds:
        def __init__(self):
            self.asked = []

        def run(self, probes):
            self.asked += probes
            return [BuildProbeResult(p, "passed", None, p.soak_s, (STARTUP + p.soak_s) / HOUR) for p in probes]

    inner = Builds()
    probe = BuildProbe(3, "b3", 20 * HOUR)
    (r,) = ChunkedOracle(inner, 8 * HOUR, BUILD_PIECES).run([probe])
    assert [(p.index, p.soak_s / HOUR) for p in inner.asked] == [(3, 8), (3, 8), (3, 4)]
    assert r.probe == probe and r.outcome == "passed" and r.exposure_s == 20 * HOUR


def test_a_driver_that_dies_mid_probe_resumes_at_the_piece_it_was_soaking(tmp_path):
    cap = 1800.0     # the necessity soaks of this bisection run hours: every one is cut
    settings = Settings(confidence=0.95)

    def run(oracle):
        return bisect(failing(6), elements(6), ChunkedOracle(oracle, cap), settings, gpu_count=lambda f: 1)

    whole = DeterministicOracle({"f2", "f4"})
    expected = run(whole)
    assert expected.status == "found" and sorted(expected.minimal) == ["f2", "f4"]
    raw = whole.probes
    # the second piece of a cut probe: the driver dies while soaking it
    dies_at = next(i for i in range(1, len(raw)) if raw[i].flags == raw[i - 1].flags and raw[i - 1].soak_s == cap)

    class Dies(DeterministicOracle):
        def run(self, probes):
            if len(self.probes) == dies_at:
                raise KeyboardInterrupt("the driver dies")
            return super().run(probes)

    path = tmp_path / "journal-flags.jsonl"
    with ProbeJournal(path, {"kind": "flags"}, resume=False) as journal:
        with pytest.raises(KeyboardInterrupt):
            run(JournalingOracle(Dies({"f2", "f4"}), journal))
    live = DeterministicOracle({"f2", "f4"})
    with ProbeJournal(path, {"kind": "flags"}, resume=True) as journal:
        result = run(JournalingOracle(live, journal))
    assert live.probes == raw[dies_at:]             # the first piece of that probe was not soaked again
    assert to_json(result) == to_json(expected)
