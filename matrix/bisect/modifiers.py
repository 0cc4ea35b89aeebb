"""Modifier verdicts: does a flag outside the set change how often the hang comes, and by how much?

A flag j outside the set is compared only between configs that differ in j alone (strata: the
failing cell and the failing cell without j, the set alone and the set plus j, ...). Pooling every
config with j against every config without it mixes in the other flags' effects: with seed 002's
autotune (8x) left out of the set, the configs without an innocent flag include the slow set alone
and those with it do not, and the innocent flag looked like a modifier in a fifth of the runs.
Within a stratum the hangs split binomially by exposure under "no effect"; the strata's sum is
tested exactly (a convolution), and the rate ratio gets the interval that inverts the same test.

Over the flags outside the set the verdicts are controlled family-wise (Holm): all of them
irrelevant, they are called modifiers at most 1 - confidence of the time in total.

`measure` soaks what the verdicts need: the failing cell to CELL_FIRST_HANGS hangs; then the flags
whose removal looks innocent so far (or that the ablation dropped with a group, never soaked alone)
removed together (one group: once its hangs against the failing cell's rule out an x
rule_out_factor modifier among them, they need no soaks of their own: 8 innocent flags cost the
group's 3-5 hangs, not some 23 hangs of their own). Most often that group is the set alone, and
most often it clears: the plain world's verdicts then cost some 8 + 5 hangs, not 12 + 4 (the
floor's split of them is a third on the failing cell). A group that reaches GROUP_MTTFS of load, or
whose hangs reject "as fast as the failing cell" first (a modifier is likely in it), first gets the
failing cell to CELL_HANGS (the side every later comparison reads), then is split: its likeliest
modifier alone and the rest (the flag whose other removals look slowest against the failing cell,
at PEEL_LEVEL or below), else in halves, and each part checked the same way, down to single flags
(an x8 modifier among 9 flags costs a level or a few of groups, not 8 innocent flags' 4 hangs
each). Then each flag left gets its removal soaked until it is called (Holm level), looks innocent (INNOCENT_HANGS hangs or more and a ratio under
INNOCENT_RATIO), has MEASURE_HANGS hangs, or has soaked out to the necessity length; a flag is
called early only at a third of its Holm share, so looking after every soak stays within budget.
By default the ablation runs `measure` before the necessity soaks: `reference_pool` hands them the
hangs these soaks bought (the failing cell's, each innocent removal's and each innocent-looking
group's) as the failing cell's rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats as st

if TYPE_CHECKING:
    from .search import Search

MEASURE_HANGS = 10          # hangs of the failing cell and of a suspect's removal before a verdict without more
INNOCENT_RATIO = 1.5       # a removal with INNOCENT_HANGS+ hangs and a ratio under this looks innocent: no more soaks
INNOCENT_HANGS = 4         # 2: an 8x modifier's quick hangs looked innocent 9 % of the time; 3: 2 %
CELL_FIRST_HANGS = 8       # the failing cell's hangs before the first group check (6 and 12 tried: docs/bisect-history.md)
CELL_HANGS = 12            # ... and once a group does not clear: the side of every comparison that follows
GROUP_RATIO = 3.0          # a suspect joins the group removal while its own removal looks at most this much slower
GROUP_MTTFS = 20.0         # the most load (failing-cell MTTFs) the group's removal gets to rule out a modifier
GROUP_SLOW_LEVEL = 0.05    # ... unless its hangs reject "as fast as the failing cell" at this level first
REFERENCE_LEVEL = 0.05     # a removal joins the failing cell's reference rate unless told apart at this level
GROUP_RULE_OUT_SHARE = 3.0  # a group clears its flags at (1 - confidence) / this (6 tried: docs/bisect-history.md)
SOAK_MTTFS = 2.0           # a modifier soak: at most this many failing-cell MTTFs (4 tried: docs/bisect-history.md)
PEEL_LEVEL = 0.05          # a group that did not clear gives up the flag whose other removals look this slow
RATIO_GRID = np.exp(np.linspace(math.log(1e-3), math.log(1e3), 481))


@dataclass(frozen=True)
class Comparison:
    """Rate with the flag / rate without it, in configs that differ in that flag alone."""

    ratio: float                 # Mantel-Haenszel; inf when no hang without it, nan when no data
    low: float
    high: float
    p_value: float               # two-sided exact, stratified
    hangs_with: int
    hangs_without: int
    exposure_with: float
    exposure_without: float


def strata(search: Search, bit: int, within: int) -> list[tuple[int, float, int, float]]:
    """(hangs, exposure) with and without `bit` for each pair of configs that contain `within`
    and differ in `bit` alone, both soaked."""
    out = []
    for m, without in search.configs.items():
        if m & bit or (m & within) != within or without.exposure_s <= 0:
            continue
        with_ = search.configs.get(m | bit)
        if with_ is None or with_.exposure_s <= 0:
            continue
        out.append((with_.hangs, with_.exposure_s, without.hangs, without.exposure_s))
    return out


def _sum_pmf(ns: list[int], ps: np.ndarray) -> np.ndarray:
    """P(sum of Binomial(n_s, p_s) = x) for x = 0..sum(n), rows of `ps` being ratio values."""
    pmf = np.ones((ps.shape[0], 1))
    for s, n in enumerate(ns):
        k = np.arange(n + 1)
        part = st.binom.pmf(k[None, :], n, ps[:, s:s + 1])
        pmf = np.array([np.convolve(a, b) for a, b in zip(pmf, part)])
    return pmf


def compare(rows: list[tuple[int, float, int, float]], confidence: float, interval: bool = True) -> Comparison:
    """The stratified exact comparison of the rate with and without a flag (`interval`: with the
    ratio's interval, which inverts the test over a grid of ratios: the slow part)."""
    ha = sum(r[0] for r in rows)
    hb = sum(r[2] for r in rows)
    ea = sum(r[1] for r in rows)
    eb = sum(r[3] for r in rows)
    ns = [r[0] + r[2] for r in rows if r[0] + r[2] > 0]
    used = [r for r in rows if r[0] + r[2] > 0]
    if not ns:
        return Comparison(math.nan, 0.0, math.inf, 1.0, ha, hb, ea, eb)
    num = sum(r[0] * r[3] / (r[1] + r[3]) for r in used)
    den = sum(r[2] * r[1] / (r[1] + r[3]) for r in used)
    ratio = num / den if den > 0 else math.inf
    grid = np.concatenate([[1.0], RATIO_GRID]) if interval else np.array([1.0])
    ea_s = np.array([r[1] for r in used])
    eb_s = np.array([r[3] for r in used])
    ps = grid[:, None] * ea_s[None, :] / (grid[:, None] * ea_s[None, :] + eb_s[None, :])
    pmf = _sum_pmf(ns, ps)
    upper = pmf[:, ha:].sum(axis=1)          # P(X >= observed | ratio)
    lower = pmf[:, :ha + 1].sum(axis=1)      # P(X <= observed | ratio)
    p_value = float(min(1.0, 2.0 * min(upper[0], lower[0])))
    if not interval:
        return Comparison(ratio, math.nan, math.nan, p_value, ha, hb, ea, eb)
    a = (1.0 - confidence) / 2.0
    inside = (upper[1:] > a) & (lower[1:] > a)
    low = float(RATIO_GRID[inside].min()) if inside.any() else math.nan
    high = float(RATIO_GRID[inside].max()) if inside.any() else math.nan
    if inside.any() and inside[0]:
        low = 0.0
    if inside.any() and inside[-1]:
        high = math.inf
    return Comparison(ratio, low, high, p_value, ha, hb, ea, eb)


def p_as_strong(rows: list[tuple[int, float, int, float]], factor: float) -> float:
    """P(at most the observed hangs with the flag | rate with it = factor x without), stratified:
    small when the flag (or group) cannot be an x factor modifier."""
    used = [r for r in rows if r[0] + r[2] > 0]
    if not used:
        return 1.0
    ps = np.array([[factor * r[1] / (factor * r[1] + r[3]) for r in used]])
    pmf = _sum_pmf([r[0] + r[2] for r in used], ps)[0]
    return float(pmf[:sum(r[0] for r in used) + 1].sum())


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down: which hypotheses are rejected, family-wise at `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def comparisons(search: Search, minimal_mask: int, interval: bool = True) -> dict[int, Comparison]:
    """Each flag outside the set: its stratified comparison within configs that hold the set."""
    out = {}
    for j in range(search.n):
        bit = 1 << j
        if minimal_mask & bit:
            continue
        out[j] = compare(strata(search, bit, minimal_mask), search.s.confidence, interval)
    return out


def called(search: Search, minimal_mask: int) -> dict[int, tuple[Comparison, bool]]:
    """Each flag outside the set: its comparison and whether Holm calls it a modifier."""
    comps = comparisons(search, minimal_mask)
    keys = list(comps)
    rejected = holm([comps[j].p_value for j in keys], 1.0 - search.s.confidence)
    return {j: (comps[j], r) for j, r in zip(keys, rejected)}


def measure(search: Search, minimal_mask: int, longest_s: float) -> None:
    """Soak what the modifier verdicts need (module docstring); `longest_s` bounds each removal's
    total exposure (a flag whose removal slows the hang past it is left undecided: irrelevant)."""
    full = search.full
    if full == minimal_mask:
        return
    suspects = _suspects(search, minimal_mask, longest_s)
    if not suspects:
        return
    cell = search.stats_of(full)
    _top_up_cell(search, CELL_FIRST_HANGS)
    _group_check(search, minimal_mask, longest_s)
    while not search.over_budget():
        suspects = _suspects(search, minimal_mask, longest_s)
        if not suspects:
            return
        _top_up_cell(search, CELL_HANGS)
        # with fewer suspects than --parallel, the width is dealt out round-robin: copies of a
        # removal are independent soaks whose exposure pools
        width = max(1, search.s.parallel)
        picked = suspects[:width]
        batch = []
        for i, j in enumerate(picked):
            copies = len(range(i, width, len(picked)))
            target = full & ~(1 << j)
            cs = search.stats_of(target)
            mttf = cell.exposure_s / max(cell.hangs, 1)
            soak = min(max(SOAK_MTTFS * mttf, cs.exposure_s / max(cs.hangs, 1), search.s.startup_s),
                       max((longest_s - cs.exposure_s) / copies, search.s.startup_s))
            batch += [(target, soak, "modifiers")] * copies
        search.run(batch)


def _top_up_cell(search: Search, hangs: int) -> None:
    """Soak the failing cell until it has hung `hangs` times."""
    cell = search.stats_of(search.full)
    while cell.hangs < hangs and not search.over_budget():
        mttf = cell.exposure_s / max(cell.hangs, 1)
        search.run([(search.full, max(3.0 * mttf, search.s.startup_s), "modifiers")] * max(1, search.s.parallel))


def _group_check(search: Search, minimal_mask: int, longest_s: float) -> None:
    """Once the failing cell's rate is known, the suspects that look innocent so far (their
    removal hung, not much slower than the failing cell, or they were dropped with a group in the
    ablation) are removed together, and the group's removal is soaked until its hangs rule out an
    x rule_out_factor modifier among them (_rules_out: short of two that cancel, none of them is
    one, and none needs soaks of its own), look slower than the failing cell (_looks_slow) or it
    has had GROUP_MTTFS of load: then each half is a group of its own, down to single flags (which
    `measure` soaks one by one). All the flags outside the set together is the set alone, whose
    earlier soaks count."""
    cell = search.stats_of(search.full)
    mttf = cell.exposure_s / max(cell.hangs, 1)
    comps = comparisons(search, minimal_mask, interval=False)
    # a suspect whose removal was never soaked alone was dropped with a group whose removal hung
    group = [j for j in _suspects(search, minimal_mask, longest_s)
             if (search.full & ~(1 << j)) not in search.configs
             or (comps[j].hangs_without > 0 and comps[j].ratio < GROUP_RATIO)]
    if not group:
        return
    # flags an earlier group cleared (before the set shrank) join a later one: a flag the necessity
    # soaks dropped then needs no soaks of its own either (its group is mostly the set alone)
    cleared = _cleared(search, minimal_mask)
    group += [j for j in range(search.n) if cleared >> j & 1 and j not in group]
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
        until = untils.setdefault(target, cs.exposure_s + GROUP_MTTFS * mttf)
        # with --parallel N, N copies of the group's removal at once (their exposure pools; the
        # rule-out is looked at after each round, so fewer looks, the same level)
        copies = max(1, search.s.parallel)
        while (not _rules_out(search, cs) and not _looks_slow(search, cs) and cs.exposure_s < until
               and not search.over_budget()):
            soak = max(min(SOAK_MTTFS * mttf, (until - cs.exposure_s) / copies), search.s.startup_s)
            search.run([(target, soak, "modifiers")] * copies)
        if not _rules_out(search, cs) and search.stats_of(search.full).hangs < CELL_HANGS:
            # the group did not clear: the failing cell's side of every comparison first
            _top_up_cell(search, CELL_HANGS)
            pending.insert(0, group)
            continue
        if not _rules_out(search, cs):
            # a modifier among them, likely: its likeliest one alone, or each half a group of its
            # own (a modifier among 9 flags costs a level or a few of groups, not 8 innocent flags'
            # 4 hangs each)
            pending += _split(search, minimal_mask, group, target)


def _split(search: Search, minimal_mask: int, group: list[int], target: int) -> list[list[int]]:
    """A group that did not clear, split: its likeliest modifier alone and the rest, else halves.
    The likeliest is the flag whose removals other than the group's own (the ablation's, single
    or in groups) look slowest against the failing cell, if at PEEL_LEVEL or below (a tie: the
    later flag). Peeling only a flag that stands out alone hardly ever fired (docs/bisect-history.md)."""
    cell = search.stats_of(search.full)
    if cell.hangs == 0 or len(group) < 3:
        return halves(group)
    best, best_p = None, PEEL_LEVEL
    for j in group:
        h = e = 0.0
        for m, cs in search.configs.items():
            if m == target or m == search.full or m & (1 << j) or (m & minimal_mask) != minimal_mask:
                continue
            h, e = h + cs.hangs, e + cs.exposure_s
        if e > 0:
            rows = [(cell.hangs, cell.exposure_s, int(h), e)]
            p = 1.0 - p_as_strong(rows, 1.0) + _point(rows)
            if p <= best_p:
                best, best_p = j, p
    if best is not None:
        return [[best], [j for j in group if j != best]]
    return halves(group)


def halves(group: list[int]) -> list[list[int]]:
    """A group of flags split in two (the larger half first); a single flag stays as it is."""
    half = (len(group) + 1) // 2
    return [group[:half], group[half:]] if len(group) > 1 else [group]


def _looks_slow(search: Search, cs) -> bool:
    """The config's hangs reject "as fast as the failing cell" (one-sided, GROUP_SLOW_LEVEL): a
    modifier is likely among the flags it lacks, and more soaks of it would not clear them."""
    cell = search.stats_of(search.full)
    if cell.hangs == 0 or cs.exposure_s <= 0:
        return False
    rows = [(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s)]
    upper = 1.0 - p_as_strong(rows, 1.0) + _point(rows)
    return upper <= GROUP_SLOW_LEVEL


def _point(rows: list[tuple[int, float, int, float]]) -> float:
    """P(exactly the observed hangs with the flag | no effect): p_as_strong's tail less this is
    the tail above."""
    h, e, h0, e0 = rows[0]
    return float(st.binom.pmf(h, h + h0, e / (e + e0)))


def _rules_out(search: Search, cs) -> bool:
    """The config's hangs against the failing cell's rule out "an x rule_out_factor modifier is
    among the flags it lacks" at a third of 1 - confidence (looked at after every soak). The call
    stands once made (search.cleared_groups): the level holds for the first crossing, and the
    failing cell's later hangs (its top-up to CELL_HANGS) would otherwise take it back by chance
    and send each flag of the group to soaks of its own."""
    if cs.mask in search.cleared_groups:
        return True
    cell = search.stats_of(search.full)
    if cs.hangs < 2 or cell.hangs == 0:
        return False
    p = p_as_strong([(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s)], search.s.rule_out_factor)
    if p <= (1.0 - search.s.confidence) / GROUP_RULE_OUT_SHARE:
        search.cleared_groups.add(cs.mask)
        return True
    return False


def _cleared(search: Search, minimal_mask: int) -> int:
    """Flags outside the set removed together with others in a config whose hangs rule out an
    x rule_out_factor modifier among them (a group's removal, _group_check)."""
    out = 0
    for m, cs in search.configs.items():
        gone = search.full & ~m
        if (m & minimal_mask) != minimal_mask or bin(gone).count("1") < 2:
            continue
        if _rules_out(search, cs):
            out |= gone
    return out


def _suspects(search: Search, minimal_mask: int, longest_s: float) -> list[int]:
    """Flags outside the set whose verdict more soaking of their removal may still change."""
    comps = comparisons(search, minimal_mask, interval=False)
    # a clear call stops a flag's soaks early; at a third of its Holm share, so that looking after
    # every soak does not spend the family's error budget on the innocent flags
    clear = (1.0 - search.s.confidence) / (3.0 * max(len(comps), 1))
    out = []
    cleared = _cleared(search, minimal_mask)
    for j, c in comps.items():
        if cleared >> j & 1:
            continue
        target = search.full & ~(1 << j)
        if not search.runnable[target]:
            continue
        cs = search.configs.get(target)
        if cs is None:
            out.append(j)      # dropped with a group (ablation), not yet soaked alone
            continue
        if c.p_value <= clear and (c.ratio >= 1 or cs.hangs >= INNOCENT_HANGS):
            # (a removal that hung once, quickly, is no call that the flag slows the hang)
            continue
        if cs.hangs >= MEASURE_HANGS or cs.exposure_s >= longest_s:
            continue
        if cs.hangs >= INNOCENT_HANGS and c.ratio < INNOCENT_RATIO:
            continue
        out.append(j)
    return out


def measure_length(search: Search) -> float:
    """The most a modifier verdict soaks one removal: the exposure in which a removal
    rule_out_factor x slower than the failing cell hangs MEASURE_HANGS times, and some."""
    cell = search.stats_of(search.full)
    return search.s.rule_out_factor * cell.exposure_s / max(cell.hangs, 1) * (MEASURE_HANGS + 2)


def reference_pool(search: Search, minimal_mask: int) -> tuple[float, float]:
    """Hangs and exposure of the failing cell pooled with every removal of flags outside the set
    (one flag, or a group that looks at most INNOCENT_RATIO x slower) that its own comparison with
    the failing cell does not tell apart (REFERENCE_LEVEL): the rate
    "x F slower than the failing cell" is read against. A removal that is slower (a modifier not
    yet called) only lowers the pooled rate and lengthens the rule-out; a faster one is left out."""
    cell = search.stats_of(search.full)
    h, e = float(cell.hangs), float(cell.exposure_s)
    for m, cs in search.configs.items():
        # removals of flags outside the set, alone or in groups (the ablation's and the groups')
        if m == search.full or (m & minimal_mask) != minimal_mask or cs.exposure_s <= 0 or cell.exposure_s <= 0:
            continue
        c = compare([(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s)], search.s.confidence, interval=False)
        # a group's removal joins only while it looks as fast (a modifier among its flags would slow
        # the reference, and each necessary flag's rule-out with it)
        if c.p_value > REFERENCE_LEVEL and (bin(search.full & ~m).count("1") == 1 or c.ratio < INNOCENT_RATIO):
            h, e = h + cs.hangs, e + cs.exposure_s
    return h, e
