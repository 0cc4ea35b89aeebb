"""Modifier soaks: what to soak so that each flag outside the set gets its modifier verdict
(modifier_stats.py reads the soaks and makes the calls; modifier_reads.py says what they show).

`measure` soaks the failing cell to its first hangs, then the flags that look innocent so far
removed together: one group whose hangs, against the failing cell's, rule out an x rule_out_factor
modifier among them clears them all (8 innocent flags cost the group's 3-5 hangs, not some 23 of
their own). A group that does not clear has its modifier looked for from the set's side (_locate),
else is split (_split), down to single flags; each flag left gets its removal soaked until it is
called, looks innocent, or has soaked out. Each soak runs on to where a pass would decide: a hang
ends the probe either way, so a fast config pays nothing for the longer soak and a slow one needs
one start-up, not one per piece. By default the ablation runs `measure` before the necessity soaks,
which read the hangs these soaks bought as the failing cell's rate (`reference_pool`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .modifier_reads import (
    cleared_flags,
    flags_to_soak,
    looks_fast,
    looks_slow,
    rules_out,
    slower_tail,
    until_called,
    until_slow,
)
from .modifier_stats import comparisons

if TYPE_CHECKING:
    from .search import Search


def measure(search: Search, minimal_mask: int, longest_s: float, cleared: frozenset[int]) -> frozenset[int]:
    """Soak what the modifier verdicts need (module docstring); `longest_s` bounds each removal's
    total exposure (a flag whose removal slows the hang past it is left undecided: irrelevant).
    `cleared`: the group removals an earlier call cleared; returned with the ones this call cleared."""
    found = set(cleared)
    _measure(search, minimal_mask, longest_s, found)
    return frozenset(found)


def _measure(search: Search, minimal_mask: int, longest_s: float, cleared: set[int]) -> None:
    full = search.full
    if full == minimal_mask or not flags_to_soak(search, minimal_mask, longest_s, cleared):
        return
    p = search.policy
    cell = search.stats_of(full)
    top_up_cell(search, p.cell_first_hangs)
    _group_check(search, minimal_mask, longest_s, cleared)
    while not search.over_budget():
        suspects = flags_to_soak(search, minimal_mask, longest_s, cleared)
        if not suspects:
            return
        top_up_cell(search, p.cell_hangs)
        mttf = cell.exposure_s / max(cell.hangs, 1)
        batch = []
        for j, copies in search.dealt(suspects):
            target = full & ~(1 << j)
            cs = search.stats_of(target)
            run_on = (until_called(search, minimal_mask, j, longest_s) - cs.exposure_s) / copies
            soak = min(
                max(p.soak_mttfs * mttf, cs.exposure_s / max(cs.hangs, 1), run_on, search.s.startup_s),
                max((longest_s - cs.exposure_s) / copies, search.s.startup_s),
            )
            batch += [(target, soak, "modifiers")] * copies
        search.run(batch)


def top_up_cell(search: Search, hangs: int, reference: bool = False) -> bool:
    """Soak the failing cell until it has hung `hangs` times, in soaks of policy.top_up_mttfs of its
    MTTF; for the rule-outs' `reference`, one batch of policy.reference_top_up_mttfs (no more copies
    than hangs missing), which ablation looks at before the next. Returns whether it soaked."""
    cell, p = search.stats_of(search.full), search.policy
    soaked = False
    while cell.hangs < hangs and not search.over_budget() and not (reference and soaked):
        mttf = cell.exposure_s / max(cell.hangs, 1)
        mttfs, role = (p.reference_top_up_mttfs, "calibration") if reference else (p.top_up_mttfs, "modifiers")
        copies = min(search.s.parallel, hangs - cell.hangs) if reference else search.s.parallel
        search.run([(search.full, max(mttfs * mttf, search.s.startup_s), role)] * max(1, copies))
        soaked = True
    return soaked


def _group_check(search: Search, minimal_mask: int, longest_s: float, cleared: set[int]) -> None:
    """The suspects that look innocent so far (their removal hung, not much slower than the failing
    cell, or they were dropped with a group in the ablation) removed together, soaked until the
    group's hangs rule out an x rule_out_factor modifier among them (short of two that cancel) or
    look slow, or it has had policy.group_mttfs of load. A group that does not clear has its
    modifier looked for from the set's side (_locate), else is split (_split)."""
    cell = search.stats_of(search.full)
    mttf = cell.exposure_s / max(cell.hangs, 1)
    comps = comparisons(search, minimal_mask, interval=False)
    # a suspect whose removal was never soaked alone was dropped with a group whose removal hung
    group = [
        j
        for j in flags_to_soak(search, minimal_mask, longest_s, cleared)
        if (search.full & ~(1 << j)) not in search.configs
        or (comps[j].hangs_without > 0 and comps[j].ratio < search.policy.group_ratio)
    ]
    if not group:
        return
    # flags an earlier group cleared (before the set shrank) join a later one: a flag the necessity
    # soaks dropped then needs no soaks of its own either (its group is mostly the set alone)
    gone = cleared_flags(search, minimal_mask, cleared)
    group += [j for j in range(search.n) if gone >> j & 1 and j not in group]
    pending = [group]
    untils: dict[int, float] = {}
    while pending and not search.over_budget():
        group = pending.pop(0)
        if len(group) < 2:
            continue
        target = search.full & ~sum(1 << j for j in group)
        if not search.runnable[target]:
            pending += halves(group)
            continue
        cs = search.stats_of(target)
        until = untils.setdefault(target, cs.exposure_s + search.policy.group_mttfs * mttf)
        ruled_out = _soak_group(search, target, cs, until, mttf, cleared)
        if not ruled_out and search.stats_of(search.full).hangs < search.policy.cell_hangs:
            # the group did not clear: the failing cell's side of every comparison first
            top_up_cell(search, search.policy.cell_hangs)
            pending.insert(0, group)
        elif not ruled_out and not _locate(search, minimal_mask, group, target, mttf, cleared):
            # a modifier among them, likely: its likeliest one alone, or each half a group of its
            # own (a modifier among 9 flags costs a level or a few of groups, not 8 innocent flags'
            # 4 hangs each)
            pending += _split(search, minimal_mask, group, target)


def _locate(search: Search, minimal_mask: int, group: list[int], target: int, mttf: float, cleared: set[int]) -> bool:
    """A group that did not clear: find its modifier from the other side, then clear the rest at once.
    `target` (the failing cell without the group) is slow, and `target` plus the part that holds the
    modifier hangs as fast as the failing cell (a loose call at policy.locate_level): the likeliest
    flag alone first, else halves. `target` plus the candidate lacks every other flag of the group,
    so its soak clears them all in one removal (and its hangs enter the candidate's own verdict).
    False (a loose call went wrong, or two modifiers) leaves the group to _split, every soak kept."""
    p = search.policy
    candidates = list(group)
    while len(candidates) > 1 and not search.over_budget():
        best = _likeliest(search, minimal_mask, candidates, target) if len(candidates) > 2 else None
        first, second = ([best], [j for j in candidates if j != best]) if best is not None else halves(candidates)
        added = target | sum(1 << j for j in first)
        if not search.runnable[added]:
            return False
        cs = search.stats_of(added)
        until = cs.exposure_s + p.group_mttfs * mttf
        while (
            not looks_fast(search, cs, p.locate_level)
            and not looks_slow(search, cs, p.locate_level)
            and cs.exposure_s < until
            and not search.over_budget()
        ):
            _soak_on(search, added, cs, until, mttf, p.locate_level)
        fast = looks_fast(search, cs, p.locate_level) and not looks_slow(search, cs, p.locate_level)
        candidates = first if fast else second
    if len(candidates) != 1:
        return False
    joint = target | (1 << candidates[0])
    if not search.runnable[joint]:
        return False
    cs = search.stats_of(joint)
    return _soak_group(search, joint, cs, cs.exposure_s + p.group_mttfs * mttf, mttf, cleared)


def _soak_group(search: Search, mask: int, cs, until: float, mttf: float, cleared: set[int]) -> bool:
    """Soak a group's removal until its hangs rule out a modifier among its flags, it looks slow,
    or its exposure reaches `until`. Returns whether it ruled out."""
    while (
        not rules_out(search, cs, cleared)
        and not looks_slow(search, cs)
        and cs.exposure_s < until
        and not search.over_budget()
    ):
        _soak_on(search, mask, cs, until, mttf, search.policy.group_slow_level)
    return rules_out(search, cs, cleared)


def _soak_on(search: Search, mask: int, cs, until: float, mttf: float, level: float) -> None:
    """One round of a group soak: --parallel copies (their exposure pools; the call is looked at
    after each round, so fewer looks, the same level), each on to where the config would look slow
    at `level` (at least policy.soak_mttfs failing-cell MTTFs), short of `until`."""
    copies = max(1, search.s.parallel)
    piece = max(search.policy.soak_mttfs * mttf, (until_slow(search, cs, level) - cs.exposure_s) / copies)
    soak = max(min(piece, (until - cs.exposure_s) / copies), search.s.startup_s)
    search.run([(mask, soak, "modifiers")] * copies)


def _split(search: Search, minimal_mask: int, group: list[int], target: int) -> list[list[int]]:
    """A group that did not clear, split: its likeliest modifier (_likeliest) alone and the rest, else halves."""
    cell = search.stats_of(search.full)
    if cell.hangs == 0 or len(group) < 3:
        return halves(group)
    best = _likeliest(search, minimal_mask, group, target)
    if best is not None:
        return [[best], [j for j in group if j != best]]
    return halves(group)


def _likeliest(search: Search, minimal_mask: int, group: list[int], target: int) -> int | None:
    """The flag of `group` whose removals other than `target` look slowest against the failing
    cell, if at policy.peel_level or below (a tie: the later flag); None when none does.
    benchmarks/bench_bisect.py's --told-modifier swaps this function for one told the answer."""
    cell = search.stats_of(search.full)
    best, best_p = None, search.policy.peel_level
    for j in group:
        h = e = 0.0
        for m, cs in search.configs.items():
            if m == target or m == search.full or m & (1 << j) or (m & minimal_mask) != minimal_mask:
                continue
            h, e = h + cs.hangs, e + cs.exposure_s
        if e > 0:
            p = slower_tail(cell.hangs, cell.exposure_s, int(h), e)
            if p <= best_p:
                best, best_p = j, p
    return best


def halves(group: list[int]) -> list[list[int]]:
    """A group of flags split in two (the larger half first); a single flag stays as it is."""
    half = (len(group) + 1) // 2
    return [group[:half], group[half:]] if len(group) > 1 else [group]
