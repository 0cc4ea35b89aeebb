"""Re-hash a history store's fingerprints with today's code, from the evidence each finding kept.

A fingerprint groups one bug's results across cells and nights (reports.findings). When the way it
is computed changes (a culprit inside a standard-library wait is hashed from the engine code that
waits, not from where py-spy happened to sample it; the interpreter's, the C library's and threading
libraries' own frames are left out, so a static and a shared Python build hash one bug alike), the
nights recorded before show the same bug under another fingerprint, as a finding of its own.
`soakmatrix report STORE --refingerprint` reads each hang's and crash's stacks and server log back from its cell folder,
hashes them as a new night would, and writes the new fingerprint where it differs.

A result is changed only when its evidence reads back as it was: the stuck frames computed from the
files must equal the ones recorded. Missing or rotated files, a signature no longer registered, or
frames that differ leave the recorded fingerprint as it is, and the summary says how many and why.
There is no scheme version to compare: every pass re-hashes every result from its evidence, so
running it after an upgrade is always safe, and a second run changes nothing.
`recompute` decides; reading files and writing the store are passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from soakmatrix.jobs.culprit import culprit_report
from soakmatrix.jobs.signatures import (
    SIGNATURES,
    STUCK_FRAMES_KEPT,
    Signature,
    after_startup,
    clues_from_texts,
    fingerprint,
    stuck_frames,
)
from soakmatrix.matrix.contracts.result import CellResult

STACK_ARTIFACTS = ("py_spy",)  # py-spy's dump of every engine process (jobs.evidence)
STACK_DUMP_PREFIX = "VLLM_STACK_DUMP_"  # vLLM's own watchdog dumps, also read as stacks

# why a result keeps its recorded fingerprint
SAME = "same"
CHANGED = "changed"
NO_EVIDENCE = "no stacks on disk"
NO_FRAMES = "no stuck frames recorded"
UNKNOWN_SIGNATURE = "signature no longer registered"
DIFFERENT_EVIDENCE = "evidence reads back different frames"


@dataclass(frozen=True)
class Rehash:
    run_id: str
    cell_id: str
    old: str | None
    new: str | None  # the fingerprint to write; None when the recorded one stays
    outcome: str  # SAME, CHANGED or why it stays


def recompute(
    result: CellResult, read_text: Callable[[str], str | None], signatures: Mapping[str, Signature] | None = None
) -> tuple[str | None, str]:
    """(today's fingerprint, SAME / CHANGED) for `result` from its stored evidence, or (None, why
    not). `read_text(path)` returns a file's text, or None when it is gone."""
    table = SIGNATURES if signatures is None else signatures
    sig = table.get(result.signature or "")
    if sig is None:
        return None, UNKNOWN_SIGNATURE
    if not result.stuck_frames:
        # a fingerprint from log lines or from nothing: computed today as it always was
        return None, NO_FRAMES
    stack_paths = [
        path
        for name, path in sorted(result.artifacts.items())
        if name in STACK_ARTIFACTS or name.startswith(STACK_DUMP_PREFIX)
    ]
    stack_texts = [text for text in map(read_text, stack_paths) if text]
    if not stack_texts:
        return None, NO_EVIDENCE
    log = read_text(result.artifacts["server_log"]) if "server_log" in result.artifacts else None
    clues = clues_from_texts(stack_texts, after_startup((log or "").splitlines()))
    report = culprit_report(clues.stacks)
    frames = stuck_frames(clues, sig.anchor, report)
    if [str(f) for f in frames[:STUCK_FRAMES_KEPT]] != list(result.stuck_frames):
        return None, DIFFERENT_EVIDENCE
    new = fingerprint(sig, frames, clues, report)
    return new, SAME if new == result.fingerprint else CHANGED


def read_text_or_none(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def refingerprint(store, read_text: Callable[[str], str | None] = read_text_or_none) -> list[Rehash]:
    """Every fingerprinted hang and crash of `store` (a HistoryStore) re-hashed; the changed ones
    written back, one transaction each (an interrupted pass leaves every result either old or new)."""
    out = []
    for run_id, result in store.fingerprinted():
        new, outcome = recompute(result, read_text)
        if outcome == CHANGED:
            store.set_fingerprint(run_id, result.cell_id, new)
        out.append(Rehash(run_id, result.cell_id, result.fingerprint, new if outcome == CHANGED else None, outcome))
    return out


def summary(rehashes: list[Rehash]) -> str:
    """'re-hashed 7 hang and crash result(s): 5 changed (5 fingerprint(s) -> 1), 1 the same, kept as
    recorded: 1 (no stacks on disk)'."""
    counts = Counter(r.outcome for r in rehashes)
    before = {r.old for r in rehashes if r.outcome == CHANGED}
    after = {r.new for r in rehashes if r.outcome == CHANGED}
    line = f"re-hashed {len(rehashes)} hang and crash result(s): {counts[CHANGED]} changed"
    if counts[CHANGED]:
        line += f" ({len(before)} fingerprint(s) -> {len(after)})"
    line += f", {counts[SAME]} the same"
    kept = [(why, n) for why, n in sorted(counts.items()) if why not in (SAME, CHANGED)]
    if kept:
        line += ", kept as recorded: " + ", ".join(f"{n} ({why})" for why, n in kept)
    return line + "\n"
