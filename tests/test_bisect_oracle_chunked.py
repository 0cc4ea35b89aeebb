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


class MeasuredShort(HangsAt):
    """A real soak job: its pass measures the load it drove, a few milliseconds under the soak asked."""

    def run(self, probes):
        return [ProbeResult(r.probe, r.outcome, r.signature, r.exposure_s - 0.014, r.gpu_hours, r.message)
                for r in super().run(probes)]


def test_a_pass_measured_a_hair_under_its_soak_is_the_whole_soak_not_a_piece_short():
    """A soak job that passed soaked what it was asked; the load it measured may fall milliseconds
    short, and those milliseconds must not cost another server start (on the real engine that
    start soaked 14 ms, completed no request and was an infra error, three times)."""
    inner = MeasuredShort()
    (r,) = ChunkedOracle(inner, 12 * HOUR).run([Probe({"mtp": 1}, 45.0, "baseline")])
    assert [p.soak_s for p in inner.asked] == [45.0]
    assert r.outcome == "passed" and r.exposure_s == pytest.approx(45.0 - 0.014)
    inner = MeasuredShort()
    (r,) = ChunkedOracle(inner, 12 * HOUR).run([Probe({"mtp": 1}, 30 * HOUR)])
    assert [p.soak_s / HOUR for p in inner.asked] == [12, 12, 6]
    assert r.exposure_s == pytest.approx(30 * HOUR - 3 * 0.014)


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


class LosesItsNodeOnce:
    """Build probes: builds from `change_point` hang at `hang_s` of load, the rest pass; the
    `lost_at`-th piece asked (1-based) is a lost node (untestable) instead."""

    def __init__(self, change_point, lost_at, hang_s=1800.0):
        self.cp, self.lost_at, self.hang_s, self.asked = change_point, lost_at, hang_s, []

    def run(self, probes):
        out = []
        for p in probes:
            self.asked.append(p)
            if len(self.asked) == self.lost_at:
                out.append(BuildProbeResult(p, "untestable", None, 0.0, STARTUP / HOUR, "the node was lost"))
            elif p.index >= self.cp and self.hang_s < p.soak_s:
                out.append(BuildProbeResult(p, "hang", "shm_broadcast_timeout", self.hang_s,
                                            (STARTUP + self.hang_s) / HOUR))
            else:
                out.append(BuildProbeResult(p, "passed", None, p.soak_s, (STARTUP + p.soak_s) / HOUR))
        return out


def test_a_build_piece_that_cannot_run_after_pieces_passed_is_a_pass_of_what_was_soaked():
    inner = LosesItsNodeOnce(change_point=9, lost_at=3)
    probe = BuildProbe(2, "b2", 30 * HOUR)
    (r,) = ChunkedOracle(inner, 12 * HOUR, BUILD_PIECES).run([probe])
    # two pieces of 12 h soaked the build: it installed and ran, so it is not untestable
    assert r.probe == probe and r.outcome == "passed" and r.exposure_s == 24 * HOUR
    assert r.gpu_hours == pytest.approx(3 * STARTUP / HOUR + 24)    # the lost piece's start-up is paid
    assert r.extra["interrupted"] == "the node was lost" and "the node was lost" in r.message
    # the first piece itself not running still makes the probe untestable, as a probe in one piece
    inner = LosesItsNodeOnce(change_point=9, lost_at=1)
    (r,) = ChunkedOracle(inner, 12 * HOUR, BUILD_PIECES).run([probe])
    assert r.outcome == "untestable" and r.exposure_s == 0.0


def test_a_lost_node_in_the_refuting_soak_leaves_the_answer_a_build_not_a_range():
    from soakmatrix.matrix.build_bisect import FOUND, BuildSettings, bisect_builds

    names = [f"b{i}" for i in range(16)]
    cut = 1 * HOUR        # the end game's refuting soak of the last good build runs longer: it is cut
    whole = LosesItsNodeOnce(change_point=9, lost_at=0)
    settings = BuildSettings(signature="shm_broadcast_timeout")
    expected = bisect_builds(names, ChunkedOracle(whole, cut, BUILD_PIECES), settings)
    assert expected.status == FOUND and expected.first_bad == 9
    # lose the node on the second piece of the last good build's first probe longer than the cut
    first_piece = {}

    class Spy:
        def run(self, probes):
            long = [p for p in probes if p.index == 8 and p.soak_s > cut]
            if long and "at" not in first_piece and len(probes) == 1:
                first_piece["at"] = len(whole.asked)      # pieces asked before this probe's first
            return chunked.run(probes)

    whole = LosesItsNodeOnce(change_point=9, lost_at=0)
    chunked = ChunkedOracle(whole, cut, BUILD_PIECES)
    assert bisect_builds(names, Spy(), settings).gpu_hours == pytest.approx(expected.gpu_hours)
    second = first_piece["at"] + 1                        # 0-based: the probe's second piece
    lossy = LosesItsNodeOnce(change_point=9, lost_at=second + 1)
    r = bisect_builds(names, ChunkedOracle(lossy, cut, BUILD_PIECES), settings)
    assert r.status == FOUND and r.first_bad == 9 and r.last_good == 8 and not r.untestable
    assert r.posterior >= 0.99
    # what the lost node costs is at most its piece's start-up: the piece that passed before it is not
    # soaked again (the load the lost piece did not soak may be soaked later, in a probe asked anyway)
    assert expected.gpu_hours - 1e-9 <= r.gpu_hours <= expected.gpu_hours + STARTUP / HOUR + 1e-9
    assert r.evidence[8].exposure_s == pytest.approx(expected.evidence[8].exposure_s)


def test_a_flag_piece_that_cannot_run_after_pieces_passed_says_how_much_load_passed():
    class LosesTheSecondPiece(HangsAt):
        def run(self, probes):
            if len(self.asked) == 1:
                self.asked.append(probes[0])
                return [ProbeResult(probes[0], "infra_error", None, 0.0, STARTUP / HOUR, "the node was lost")]
            return super().run(probes)

    probe = Probe({"mtp": 1}, 30 * HOUR, "failing cell")
    (r,) = ChunkedOracle(LosesTheSecondPiece(), 12 * HOUR).run([probe])
    # still the error (the flag bisection retries it), with the 12 h its first piece soaked
    assert r.probe == probe and r.outcome == "infra_error" and r.extra["passed_exposure_s"] == 12 * HOUR
    assert r.gpu_hours == pytest.approx(2 * STARTUP / HOUR + 12)


def test_the_load_of_pieces_that_passed_before_a_lost_node_counts_in_the_bisection():
    cap = 1800.0
    settings = Settings(confidence=0.95)

    def run(oracle):
        return bisect(failing(6), elements(6), ChunkedOracle(oracle, cap), settings, gpu_count=lambda f: 1)

    whole = DeterministicOracle({"f2", "f4"})
    expected = run(whole)
    raw = whole.probes
    # the node is lost on the second piece of the first cut probe of a config that never hangs (a
    # necessity soak)
    lost_at = next(i for i in range(1, len(raw)) if raw[i].flags == raw[i - 1].flags and raw[i - 1].soak_s == cap
                   and not (raw[i].flags["f2"] and raw[i].flags["f4"]))
    lost_flags = raw[lost_at].flags

    class LosesItsNode(DeterministicOracle):
        def run(self, probes):
            if len(self.probes) == lost_at:
                self.probes.append(probes[0])
                return [ProbeResult(probes[0], "infra_error", None, 0.0, self.startup_s / HOUR, "the node was lost")]
            return super().run(probes)

    result = run(LosesItsNode({"f2", "f4"}))
    assert result.status == "found" and sorted(result.minimal) == ["f2", "f4"]

    (lost,) = [cs for cs in result.configs if cs.flags == lost_flags]
    # the probe is an error to the step that asked for it; the piece that passed before the loss is
    # load without a hang all the same (it was 0 before)
    assert lost.errors == 1 and lost.hangs == 0 and lost.exposure_s >= cap
