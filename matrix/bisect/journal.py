"""The probe journal: every answered probe of a bisection on disk, so that a bisection whose driver
crashed or was stopped resumes where it stopped instead of soaking the same hours again.

A bisection is a pure function of its oracle's answers (`bisect(flags, probe)`, `bisect_builds`):
replaying the recorded answers in order puts it back in the very state it was in, and from there
the oracle soaks for real again. The journal is a JSON-lines file: a header (what bisection it is:
the cell, the target, the options that steer the search) and one line per answered batch of probes
(the probes asked, the answers), each flushed and fsynced before the bisection reads the answers,
so a crash loses at most the batch that was soaking. A resumed bisection must ask exactly the
probes the journal recorded, in order; one that asks otherwise (other code, or a history store that
grew since) is stopped with the line it parted at, never fed answers to another question.

`JournalingOracle` wraps any probe oracle (flag or build) given a `Codec` for its probes and
answers: `FLAG_CODEC` here, `build_bisect.journal.BUILD_CODEC` for builds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .oracle import Probe, ProbeResult
from .oracle_chunked import ChunkedOracle

# The journal file's own format (what a reader checks before it trusts the file), not a tuning:
# VERSION changes only with the layout of the lines.
FORMAT = "soakmatrix bisect journal"
VERSION = 1


class JournalError(Exception):
    """A journal that cannot be used as asked (exit 2): it holds another bisection, or a fresh start
    would overwrite its probes, or the resumed bisection parted from it."""


@dataclass(frozen=True)
class Codec:
    """How one kind of oracle's probes and answers are written and read back."""

    probe: Callable[[Any], dict]  # a probe as JSON: what a replay must ask again
    result: Callable[[Any], dict]  # an answer as JSON
    load: Callable[[Any, Mapping[str, Any]], Any]  # (the probe asked, the recorded answer) -> the answer


def _plain(value: Any) -> Any:
    """JSON's own view of a value (tuples as lists, keys as strings): what a replay compares."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _flag_probe(probe: Probe) -> dict:
    return {"flags": dict(probe.flags), "soak_s": probe.soak_s, "label": probe.label}


def _flag_result(result: ProbeResult) -> dict:
    return {
        "outcome": str(getattr(result.outcome, "value", result.outcome)),
        "signature": result.signature,
        "exposure_s": result.exposure_s,
        "gpu_hours": result.gpu_hours,
        "message": result.message,
        "extra": dict(result.extra),
    }


def _flag_load(probe: Probe, doc: Mapping[str, Any]) -> ProbeResult:
    return ProbeResult(
        probe,
        doc["outcome"],
        doc["signature"],
        float(doc["exposure_s"]),
        float(doc["gpu_hours"]),
        doc.get("message", ""),
        doc.get("extra", {}),
    )


FLAG_CODEC = Codec(_flag_probe, _flag_result, _flag_load)


@dataclass(frozen=True)
class Batch:
    line: int  # its line in the file (1-based; the header is line 1)
    probes: list  # the probes asked, as JSON
    results: list  # the answers, as JSON


class ProbeJournal:
    """The journal file at `path` for the bisection `header` describes. `resume=False` starts it
    afresh and refuses to overwrite one that holds probes; `resume=True` reads the recorded batches
    (a missing file resumes nothing) after checking that the file's header is this bisection's."""

    def __init__(self, path: str | Path, header: Mapping[str, Any], *, resume: bool):
        self.path = Path(path)
        self.header = _plain({"format": FORMAT, "version": VERSION, **header})
        self.batches: list[Batch] = []
        self._torn_at: int | None = None
        recorded = self._read() if self.path.exists() else None
        if recorded is not None and not resume and recorded[1]:
            raise JournalError(
                f"{self.path} holds {_count(recorded[1])} answered probe(s) of an earlier bisection: "
                "--resume continues it; another --out starts a new one"
            )
        if resume and recorded is not None:
            self._check_header(recorded[0])
            self.batches = recorded[1]
            self._file = self.path.open("a", encoding="utf-8")
            if self._torn_at is not None:
                self._file.truncate(self._torn_at)
                if not self.path.read_bytes().endswith(b"\n"):
                    self._file.write("\n")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")
            self._write(self.header)

    @property
    def probes(self) -> int:
        return _count(self.batches)

    def append(self, probes: list, results: list) -> None:
        self.batches.append(Batch(len(self.batches) + 2, probes, results))
        self._write({"probes": probes, "results": results})

    def close(self) -> None:
        self._file.close()

    def _write(self, doc: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def _read(self) -> tuple[dict, list[Batch]]:
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        docs = []
        for number, line in enumerate(lines, 1):
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines) and not text.endswith("\n"):
                    # a line torn by the crash: its batch never reached the bisection; cut it off so
                    # that the next answer starts a line of its own
                    self._torn_at = len(text.encode("utf-8")) - len(line.encode("utf-8"))
                    break
                raise JournalError(f"{self.path}:{number}: not a journal line (JSON expected)") from None
        if not docs or not isinstance(docs[0], dict) or docs[0].get("format") != FORMAT:
            raise JournalError(f"{self.path}:1: not a soakmatrix bisect journal; another --out starts a new one")
        if docs[0].get("version") != VERSION:
            raise JournalError(
                f"{self.path}:1: version: journal version {docs[0].get('version')!r}, this soakmatrix reads {VERSION}"
            )
        batches = []
        for number, doc in enumerate(docs[1:], 2):
            if not (
                isinstance(doc, dict)
                and isinstance(doc.get("probes"), list)
                and isinstance(doc.get("results"), list)
                and len(doc["probes"]) == len(doc["results"])
            ):
                raise JournalError(f"{self.path}:{number}: probes and results expected, one answer per probe")
            batches.append(Batch(number, doc["probes"], doc["results"]))
        if docs and not text.endswith("\n") and self._torn_at is None:
            self._torn_at = len(text.encode("utf-8"))  # a whole last line whose newline was not written
        return docs[0], batches

    def _check_header(self, recorded: Mapping[str, Any]) -> None:
        for key in sorted(set(recorded) | set(self.header)):
            if recorded.get(key) != self.header.get(key):
                raise JournalError(
                    f"{self.path}:1: {key}: the journal's bisection had {recorded.get(key)!r}, this one "
                    f"has {self.header.get(key)!r}; resume with the same cell and options, or start "
                    "a new one with another --out"
                )

    def __enter__(self) -> ProbeJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _count(batches: Sequence[Batch]) -> int:
    return sum(len(b.probes) for b in batches)


class JournalingOracle:
    """Answers a bisection's batches from the journal while it has them, then from `inner`, writing
    each new batch's answers to the journal before handing them on. When the replay ends, `inner`
    hears how many rounds and probes came before it (`resume_after`, if it has one), so a soak
    oracle numbers its artifacts' folders and its engines' seeds after them."""

    def __init__(self, inner: Any, journal: ProbeJournal, codec: Codec = FLAG_CODEC):
        self.inner, self.journal, self.codec = inner, journal, codec
        self.replayed = 0  # batches answered from the journal
        self.replayed_probes = 0
        self._live = False

    def run(self, probes: Sequence[Any]) -> list[Any]:
        asked = [_plain(self.codec.probe(p)) for p in probes]
        if not self._live and self.replayed < len(self.journal.batches):
            batch = self.journal.batches[self.replayed]
            if batch.probes != asked:
                raise JournalError(
                    f"{self.journal.path}:{batch.line}: the resumed bisection asks {_said(asked)} where "
                    f"the journal recorded {_said(batch.probes)} (other code, or a history store that "
                    "changed since); start a new one with another --out"
                )
            self.replayed += 1
            self.replayed_probes += len(probes)
            return [self.codec.load(p, r) for p, r in zip(probes, batch.results, strict=False)]
        if not self._live:
            self._live = True
            resume_after = getattr(self.inner, "resume_after", None)
            if resume_after is not None and self.replayed:
                resume_after(self.replayed, self.replayed_probes)
        results = list(self.inner.run(probes))
        self.journal.append(asked, [_plain(self.codec.result(r)) for r in results])
        return results


def _said(probes: list) -> str:
    return "; ".join(p.get("label") or json.dumps(p, sort_keys=True) for p in probes) or "nothing"


def journaled(
    oracle: Any, journal: ProbeJournal | None, max_soak_s: float | None, codec: Codec = FLAG_CODEC, pieces: Any = None
) -> Any:
    """The oracle a CLI bisection asks: the journal (if any) around `oracle`, and around that the
    cut of long probes into pieces of `max_soak_s` (if any), so that every piece is an answered probe
    of its own in the journal."""
    if journal is not None:
        oracle = JournalingOracle(oracle, journal, codec)
    if max_soak_s:
        oracle = ChunkedOracle(oracle, max_soak_s, pieces)
    return oracle
