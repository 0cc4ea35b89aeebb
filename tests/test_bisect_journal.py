"""The probe journal (`matrix/bisect/journal.py`): a bisection whose driver dies resumes from the
answered probes on disk to the very answer an uninterrupted run gives, soaking only what is left."""

from __future__ import annotations

import json

import pytest

from soakmatrix.matrix.bisect import Settings, bisect
from soakmatrix.matrix.bisect.journal import JournalError, JournalingOracle, ProbeJournal
from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
from soakmatrix.matrix.bisect.report import to_json
from tests.test_bisect import bool_flags, elements, failing, planted

N = 6
HEADER = {"kind": "flags", "cell": "c0ffee", "seed": 5}


class Recorder:
    """Passes batches to `inner` and keeps every (probes, answers)."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def run(self, probes):
        results = self.inner.run(probes)
        self.batches.append((list(probes), results))
        return results


class Replay:
    """Answers batches `start`, `start + 1`, ... of a recorded run, checking the probes are the same;
    `crash_at` raises (the driver dies) when that batch is asked."""

    def __init__(self, batches, start=0, crash_at=None):
        self.batches, self.next, self.crash_at = batches, start, crash_at
        self.asked = 0
        self.resumed = None

    def run(self, probes):
        if self.next == self.crash_at:
            raise KeyboardInterrupt("the driver dies")
        recorded, results = self.batches[self.next]
        assert list(probes) == recorded
        self.next += 1
        self.asked += 1
        return results

    def resume_after(self, rounds, probes):
        self.resumed = (rounds, probes)


def uninterrupted():
    model = planted(N, ["f1", "f4"], modifiers=())
    oracle = Recorder(VirtualOracle(model, seed=7, registry=bool_flags(N), gpu_count=lambda f: 1))
    result = bisect(failing(N), elements(N), oracle, Settings(confidence=0.95), gpu_count=lambda f: 1)
    return oracle.batches, result


def run_with(oracle):
    return bisect(failing(N), elements(N), oracle, Settings(confidence=0.95), gpu_count=lambda f: 1)


def test_a_bisection_killed_midway_resumes_to_the_uninterrupted_answer(tmp_path):
    batches, expected = uninterrupted()
    assert expected.status == "found" and len(batches) > 10
    path = tmp_path / "journal-flags.jsonl"
    crash_at = len(batches) // 2
    with ProbeJournal(path, HEADER, resume=False) as journal:
        with pytest.raises(KeyboardInterrupt):
            run_with(JournalingOracle(Replay(batches, crash_at=crash_at), journal))
    # every batch answered before the crash is on disk, nothing more
    assert len(path.read_text().splitlines()) == 1 + crash_at

    live = Replay(batches, start=crash_at)
    with ProbeJournal(path, HEADER, resume=True) as journal:
        assert journal.probes == sum(len(p) for p, _ in batches[:crash_at])
        oracle = JournalingOracle(live, journal)
        result = run_with(oracle)
    assert oracle.replayed == crash_at
    assert live.asked == len(batches) - crash_at            # only what was left was soaked
    assert live.resumed == (crash_at, sum(len(p) for p, _ in batches[:crash_at]))
    assert to_json(result) == to_json(expected)
    assert len(path.read_text().splitlines()) == 1 + len(batches)


def test_a_fresh_start_never_overwrites_answered_probes(tmp_path):
    batches, _ = uninterrupted()
    path = tmp_path / "j.jsonl"
    with ProbeJournal(path, HEADER, resume=False) as journal:
        run_with(JournalingOracle(Replay(batches), journal))
    before = path.read_text()
    with pytest.raises(JournalError, match=r"j\.jsonl holds \d+ answered probe\(s\).*--resume continues it"):
        ProbeJournal(path, HEADER, resume=False)
    assert path.read_text() == before


def test_resuming_another_bisection_names_the_key_that_differs(tmp_path):
    path = tmp_path / "j.jsonl"
    ProbeJournal(path, HEADER, resume=False).close()
    with pytest.raises(JournalError, match=r"j\.jsonl:1: seed: the journal's bisection had 5, this one has 6"):
        ProbeJournal(path, {**HEADER, "seed": 6}, resume=True)
    path.write_text('{"not": "a journal"}\n')
    with pytest.raises(JournalError, match=r"j\.jsonl:1: not a soakmatrix bisect journal"):
        ProbeJournal(path, HEADER, resume=True)


def killed_at(path, batch):
    """The uninterrupted run's batches and answer, and a journal at `path` of the same run killed when
    it asked for `batch`."""
    batches, expected = uninterrupted()
    with ProbeJournal(path, HEADER, resume=False) as journal:
        with pytest.raises(KeyboardInterrupt):
            run_with(JournalingOracle(Replay(batches, crash_at=batch), journal))
    return batches, expected


def test_a_line_torn_by_the_crash_is_dropped_and_a_broken_one_inside_is_an_error(tmp_path):
    path = tmp_path / "j.jsonl"
    batches, expected = killed_at(path, 4)
    with path.open("a") as f:
        f.write('{"probes": [{"flags": {"f0": tr')           # the write the crash cut short
    with ProbeJournal(path, HEADER, resume=True) as journal:
        assert len(journal.batches) == 4
        result = run_with(JournalingOracle(Replay(batches, start=4), journal))
    assert to_json(result) == to_json(expected)
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + len(batches) and all(json.loads(line) for line in lines)   # the torn piece is gone
    path.write_text("\n".join(lines[:2] + ["garbage"] + lines[2:]) + "\n")
    with pytest.raises(JournalError, match=r"j\.jsonl:3: not a journal line"):
        ProbeJournal(path, HEADER, resume=True)


def test_a_resumed_bisection_that_asks_otherwise_stops_at_the_line_it_parted(tmp_path):
    path = tmp_path / "j.jsonl"
    batches, _ = killed_at(path, 5)
    lines = path.read_text().splitlines()
    third = json.loads(lines[3])
    third["probes"][0]["soak_s"] += 1.0                       # recorded by other code
    lines[3] = json.dumps(third)
    path.write_text("\n".join(lines) + "\n")
    with ProbeJournal(path, HEADER, resume=True) as journal:
        with pytest.raises(JournalError, match=r"j\.jsonl:4: the resumed bisection asks .* where the journal recorded"):
            run_with(JournalingOracle(Replay(batches, start=5), journal))
