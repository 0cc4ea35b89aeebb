"""Smoke selection: which planned cells a pull request soaks, in which order, within which budget.

Three pure steps, each usable alone:
- `touched_flags(changed_files, source_dependencies)`: the matrix's `source_dependencies` globs
  (like vLLM's `source_file_dependencies`) map changed source paths to flag names;
- `cells_touching(cells, flags, baseline)`: keep the cells that set one of those flags away from
  the matrix's baseline, since only those exercise the changed code path;
- `informative_order(cells, strength)`: greedy prioritised covering array: each next cell covers
  the most t-way value combinations not yet covered (per GPU-hour spent), so a run cut short by a
  budget or `--fail-fast` has still seen the most interactions;
- `trim_to_budget(cells, budget)`: keep cells in order while they fit the GPU-hour budget.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .plan import PlannedCell


def read_changed_files(text: str) -> list[str]:
    """Paths from `git diff --name-only` output: one per line, blanks and `#` comments skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line.removeprefix("./"))
    return out


def glob_matches(pattern: str, path: str) -> bool:
    """Shell-style match where `**` spans directories; a pattern ending in `/` matches a whole tree.

    fnmatch's `*` already crosses `/`, which is what `dir/**` wants; `**/` in the middle also
    matches zero directories (`vllm/**/x.py` matches `vllm/x.py`).
    """
    if pattern.endswith("/"):
        pattern += "**"
    if fnmatch.fnmatchcase(path, pattern):
        return True
    return "**/" in pattern and fnmatch.fnmatchcase(path, pattern.replace("**/", ""))


def touched_flags(
    changed_files: Iterable[str], source_dependencies: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """flag name -> the changed files that touch it (only flags with at least one file)."""
    out: dict[str, list[str]] = {}
    for path in changed_files:
        for pattern, names in source_dependencies.items():
            if glob_matches(pattern, path):
                for name in names:
                    files = out.setdefault(name, [])
                    if path not in files:
                        files.append(path)
    return out


def deviations(pc: PlannedCell, baseline: Mapping[str, Any]) -> set[str]:
    """The flags a cell sets away from the baseline (a flag absent from the baseline always counts)."""
    return {name for name, value in pc.cell.flags if name not in baseline or baseline[name] != value}


def cells_touching(
    cells: Sequence[PlannedCell], flags: Iterable[str], baseline: Mapping[str, Any]
) -> list[PlannedCell]:
    wanted = set(flags)
    return [pc for pc in cells if deviations(pc, baseline) & wanted]


def _factors(pc: PlannedCell) -> list[tuple[str, Any]]:
    return [
        ("model", pc.cell.model),
        ("gpu", pc.cell.gpu),
        ("workload", pc.cell.workload),
        *((name, repr(value)) for name, value in pc.cell.flags),
    ]


def interactions(pc: PlannedCell, strength: int) -> set[tuple]:
    """The t-way value combinations a cell covers."""
    factors = _factors(pc)
    t = max(1, min(strength, len(factors)))
    return set(itertools.combinations(factors, t))


def informative_order(
    cells: Sequence[PlannedCell],
    strength: int = 2,
    baseline: Mapping[str, Any] | None = None,
    focus: Iterable[str] = (),
) -> list[PlannedCell]:
    """Greedy order: most not-yet-covered t-way interactions per GPU-hour first.

    Ties go to the cell that deviates from the baseline in more of the `focus` flags (the flags a
    change touches), then in more flags overall (hangs live in unusual combinations), then to the
    cheaper cell, then by id so the order is reproducible.
    """
    baseline = baseline or {}
    focus = set(focus)
    remaining = {pc.id: pc for pc in cells}
    covered: set[tuple] = set()
    cover = {pc.id: interactions(pc, strength) for pc in cells}
    dev = {pc.id: deviations(pc, baseline) for pc in cells}
    order: list[PlannedCell] = []

    def key(pc: PlannedCell) -> tuple:
        gain = len(cover[pc.id] - covered) / max(pc.gpu_hours, 1e-9)
        return (-gain, -len(dev[pc.id] & focus), -len(dev[pc.id]), pc.gpu_hours, pc.id)

    while remaining:
        best = min(remaining.values(), key=key)
        order.append(best)
        covered.update(cover[best.id])
        del remaining[best.id]
    return order


@dataclass(frozen=True)
class Trimmed:
    kept: list[PlannedCell]
    dropped: list[PlannedCell]

    @property
    def gpu_hours(self) -> float:
        return sum(pc.gpu_hours for pc in self.kept)


def trim_to_budget(cells: Sequence[PlannedCell], budget_gpu_hours: float | None) -> Trimmed:
    """Keep cells in the given order while they fit; a cell that does not fit is dropped and the
    next (perhaps cheaper) one is tried, so the budget is used as fully as the order allows."""
    if budget_gpu_hours is None:
        return Trimmed(list(cells), [])
    kept, dropped, spent = [], [], 0.0
    for pc in cells:
        if spent + pc.gpu_hours <= budget_gpu_hours + 1e-9:
            kept.append(pc)
            spent += pc.gpu_hours
        else:
            dropped.append(pc)
    return Trimmed(kept, dropped)
