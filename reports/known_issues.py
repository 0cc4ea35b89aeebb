"""Known issues: a YAML file that maps a finding to its upstream bug (link, title, status, workaround).

    known_issues:
      - id: vllm-42271
        title: "MTP + FULL_AND_PIECEWISE cudagraph deadlocks at batched decode"
        url: https://github.com/vllm-project/vllm/issues/42271
        status: closed               # open | closed | fixed | wontfix | unknown
        workaround: "cudagraph_mode FULL_DECODE_ONLY"
        match:                       # a fingerprint alone is enough; otherwise every rule given must hold
          fingerprints: [3f2a...]
          signature: shm_broadcast_timeout
          frames: ["acquire_read"]   # regexes: each must match one of the culprit's stuck frames
          log: ["RPC call to sample_tokens timed out"]   # each must match one of the log lines kept
          flags: {mtp: 1}            # the cell's flags must include these values

Loaded with the project's safe YAML loader (`matrix/contracts/yamlsrc.load`: limits, line numbers);
every problem is reported at once as `file:line: key: message`. `match_result` gives the first issue
(in file order) that matches a result, so a specific entry goes before a general one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.contracts.yamlsrc import Source, SpecError, load

STATUSES = ("open", "closed", "fixed", "wontfix", "unknown")
ISSUE_KEYS = {"id", "title", "url", "status", "workaround", "match", "notes"}
MATCH_KEYS = {"fingerprints", "signature", "frames", "log", "flags"}
_FINGERPRINT = re.compile(r"^[0-9a-f]{6,40}$")


@dataclass(frozen=True)
class KnownIssue:
    id: str
    title: str
    url: str = ""
    status: str = "unknown"
    workaround: str = ""
    fingerprints: frozenset[str] = frozenset()
    signature: str | None = None
    frames: tuple[re.Pattern, ...] = ()
    log: tuple[re.Pattern, ...] = ()
    flags: Mapping[str, Any] = field(default_factory=dict)
    line: int = 0

    def matches(
        self,
        fingerprint: str | None,
        signature: str | None,
        stuck_frames: Sequence[str],
        log_lines: Sequence[str],
        flags: Mapping[str, Any],
    ) -> bool:
        if fingerprint and fingerprint in self.fingerprints:
            return True
        rules = [self.signature is not None, bool(self.frames), bool(self.log)]
        if not any(rules):
            return False  # fingerprints only (or flags only): no pattern to fall back on
        if self.signature is not None and signature != self.signature:
            return False
        if any(not any(p.search(f) for f in stuck_frames) for p in self.frames):
            return False
        if any(not any(p.search(line) for line in log_lines) for p in self.log):
            return False
        return all(_same(flags.get(k), v) for k, v in self.flags.items())

    def to_dict(self) -> dict[str, str]:
        return {
            "id": self.id,
            "title": self.title,
            "url": self.url,
            "status": self.status,
            "workaround": self.workaround,
        }


def _same(actual: Any, wanted: Any) -> bool:
    return actual == wanted or str(actual).lower() == str(wanted).lower()


def load_known_issues(path: str | Path) -> list[KnownIssue]:
    """Every issue of the file, or a SpecError listing every problem as `file:line: key: message`."""
    src = load(path)
    src.raise_if_any()
    issues = _parse(src)
    src.raise_if_any()
    return issues


def _parse(src: Source) -> list[KnownIssue]:
    data = src.data
    if not isinstance(data, dict) or "known_issues" not in data:
        src.error((), "expected a mapping with a `known_issues:` list")
        return []
    for key in data:
        if key != "known_issues":
            src.error((key,), "unknown key (the file holds `known_issues:` only)")
    entries = data["known_issues"]
    if not isinstance(entries, list):
        src.error(("known_issues",), "expected a list of issues")
        return []
    out, seen = [], set()
    for i, entry in enumerate(entries):
        issue = _issue(src, ("known_issues", i), entry)
        if issue is None:
            continue
        if issue.id in seen:
            src.error(("known_issues", i, "id"), f"duplicate id {issue.id!r}")
        seen.add(issue.id)
        out.append(issue)
    return out


def _issue(src: Source, path: tuple, entry: Any) -> KnownIssue | None:
    if not isinstance(entry, dict):
        src.error(path, "expected a mapping (id, title, url, status, workaround, match)")
        return None
    before = len(src.problems)
    for key in entry:
        if key not in ISSUE_KEYS:
            src.error((*path, key), f"unknown key; expected one of {', '.join(sorted(ISSUE_KEYS))}")
    text = {}
    for key in ("id", "title", "url", "status", "workaround"):
        value = entry.get(key, "")
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            src.error((*path, key), "expected text")
            value = ""
        text[key] = str(value).strip()
    for key in ("id", "title"):
        if not text[key]:
            src.error((*path, key), "required")
    if text["url"] and not re.match(r"^https?://", text["url"]):
        src.error((*path, "url"), "expected an http(s) link")
    status = text["status"] or "unknown"
    if status not in STATUSES:
        src.error((*path, "status"), f"{status!r} is not one of {', '.join(STATUSES)}")
    match = entry.get("match")
    if not isinstance(match, dict) or not match:
        src.error((*path, "match"), "required: fingerprints, or a signature, frames or log patterns")
        return None
    for key in match:
        if key not in MATCH_KEYS:
            src.error((*path, "match", key), f"unknown key; expected one of {', '.join(sorted(MATCH_KEYS))}")
    prints = match.get("fingerprints", [])
    if isinstance(prints, str):
        prints = [prints]
    if not isinstance(prints, list) or not all(isinstance(p, str) and _FINGERPRINT.match(p) for p in prints):
        src.error((*path, "match", "fingerprints"), "expected a list of hex fingerprints (as in the reports)")
        prints = []
    signature = match.get("signature")
    if signature is not None and not isinstance(signature, str):
        src.error((*path, "match", "signature"), "expected a signature name")
        signature = None
    frames = _patterns(src, (*path, "match", "frames"), match.get("frames", []))
    log = _patterns(src, (*path, "match", "log"), match.get("log", []))
    flags = match.get("flags", {})
    if not isinstance(flags, dict):
        src.error((*path, "match", "flags"), "expected a mapping of flag: value")
        flags = {}
    if not prints and signature is None and not frames and not log:
        src.error((*path, "match"), "needs fingerprints, or a signature, frames or log patterns")
    if len(src.problems) > before:
        return None
    return KnownIssue(
        text["id"],
        text["title"],
        text["url"],
        status,
        text["workaround"],
        frozenset(prints),
        signature,
        frames,
        log,
        dict(flags),
        src.line(path),
    )


def _patterns(src: Source, path: tuple, value: Any) -> tuple[re.Pattern, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        src.error(path, "expected a list of regular expressions")
        return ()
    out = []
    for i, text in enumerate(value):
        if not isinstance(text, str) or not text:
            src.error((*path, i), "expected a regular expression")
            continue
        try:
            out.append(re.compile(text))
        except re.error as exc:
            src.error((*path, i), f"not a regular expression: {exc}")
    return tuple(out)


def match_result(issues: Sequence[KnownIssue], result: CellResult) -> KnownIssue | None:
    """The first known issue this hang or crash is an instance of (None for a pass or a new bug)."""
    if result.outcome.value not in ("hang", "crash"):
        return None
    for issue in issues:
        if issue.matches(result.fingerprint, result.signature, result.stuck_frames, result.log_tail, result.flags):
            return issue
    return None


__all__ = ["KnownIssue", "SpecError", "load_known_issues", "match_result", "STATUSES"]
