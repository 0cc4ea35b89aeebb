"""Flags that leave the set the search found: one without which the hang still comes within the cap
only changes how often (drop_modifiers), and by default one without which the hang was seen at all
(observed_without). Both read only the exact config baseline + the rest of the set: configs with
more flags may hang through another trigger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from soakmatrix.matrix.contracts import stats
from soakmatrix.matrix.contracts.durations import format_duration

if TYPE_CHECKING:
    from .search import Search


def _without(search: Search, mask: int, bit: int) -> tuple[int, float]:
    """Hangs and exposure of baseline + the set but for one element (that exact config: configs
    with more flags may hang through another trigger)."""
    cs = search.configs.get(mask & ~bit)
    return (cs.hangs, cs.exposure_s) if cs else (0, 0.0)


def drop_modifiers(search: Search, mask: int, cap: float, notes: list[str]) -> int:
    """An element whose removal still hangs within the cap only changes how often: drop it.

    Hangs seen without it count; with an explicit cap (`verify_cap`), each element is also soaked
    out until "MTTF > cap at the stated confidence" holds or it hangs.
    """
    s = search.s
    changed = True
    while changed and not search.over_budget():
        changed = False
        for i, e in enumerate(search.elements):
            bit = 1 << i
            if not mask & bit:
                continue
            h, exposure = _without(search, mask, bit)
            need = stats.soak_for_detection(cap, s.confidence) - exposure
            if h == 0 and s.verify_cap and need > 0 and search.runnable[mask & ~bit]:
                search.stats_of(mask & ~bit).role = "cap check"
                search.run([(mask & ~bit, need, "cap check")])
                h, exposure = _without(search, mask, bit)
            if s.verify_cap and h > 0 and exposure / h <= cap:
                notes.append(
                    f"{e.name} is not needed for the hang within the cap: without it "
                    f"{h} hang(s) in {format_duration(exposure)} (MTTF ~{format_duration(exposure / h)} "
                    f"<= cap {format_duration(cap)})"
                )
                mask &= ~bit
                changed = True
                break
    return mask


def observed_without(search: Search, top: int, notes: list[str]) -> int:
    """By default a flag of the set without which the hang was seen (baseline + the rest of the set
    hung) is a modifier, never necessary: it leaves the set."""
    for i, e in enumerate(search.elements):
        bit = 1 << i
        if not top & bit:
            continue
        rest = top & ~bit
        # baseline + the rest of the set, exactly: wider configs may hang through another trigger
        narrow = search.configs.get(rest)
        if narrow is not None and narrow.hangs:
            notes.append(f"{e.name} left the set: the hang was seen without it")
            top = rest
    return top
