"""What the modifier soaks read off the search state: whether a config looks slower or faster than
the failing cell, how long it would need to soak for that, which flags a group's removal cleared,
which flags still need soaks, and the failing cell's pooled reference rate.

Reads only (modifiers.py decides what to soak from them), but for `rules_out`, which adds a group
that it clears to the `cleared` set the modifier soaks pass it, so that the call stands once made.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scipy import stats as st

from .modifier_stats import compare, comparisons, p_as_strong, point_probability, strata_by_config

if TYPE_CHECKING:
    from .search import Search


def looks_fast(search: Search, cs, level: float) -> bool:
    """The config's hangs reject "x rule_out_factor slower than the failing cell" at `level`: it
    holds the modifier (a loose call: _locate's steps)."""
    cell = search.stats_of(search.full)
    if cs.hangs == 0 or cell.hangs == 0:
        return False
    return p_as_strong([(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s)], search.s.rule_out_factor) <= level


def looks_slow(search: Search, cs, level: float | None = None) -> bool:
    """The config's hangs reject "as fast as the failing cell" (one-sided, at `level`): a modifier
    is likely among the flags it lacks, and more soaks of it would not clear them."""
    level = search.policy.group_slow_level if level is None else level
    cell = search.stats_of(search.full)
    if cell.hangs == 0 or cs.exposure_s <= 0:
        return False
    return slower_tail(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s) <= level


def slower_tail(cell_hangs: int, cell_exposure_s: float, hangs: int, exposure_s: float) -> float:
    """P(the failing cell takes at least the hangs it took of both | both as fast), one-sided: small
    when the other config is slower than the failing cell (until_slow inverts it)."""
    rows = [(cell_hangs, cell_exposure_s, hangs, exposure_s)]
    return 1.0 - p_as_strong(rows, 1.0) + point_probability(rows)


def until_slow(search: Search, cs, level: float | None = None) -> float:
    """The config's exposure at which, without another hang, it would look slow (looks_slow at
    `level`); inf while the failing cell has not hung."""
    level = search.policy.group_slow_level if level is None else level
    cell = search.stats_of(search.full)
    if cell.hangs == 0:
        return math.inf
    # slower_tail, P(X >= the cell's hangs | Binomial(all hangs, the cell's share of the
    # exposure)), is the Beta(cell hangs, config hangs + 1) cdf at that share: its quantile at the
    # level is the share where the tail reaches it (a hair less, so that float rounding does not
    # leave the pass a hair short)
    share = float(st.beta.ppf(level, cell.hangs, cs.hangs + 1)) * (1.0 - 1e-9)
    if share <= 0.0:
        return math.inf
    return max(cs.exposure_s, cell.exposure_s * (1.0 - share) / share)


def until_called(search: Search, minimal_mask: int, j: int, longest_s: float) -> float:
    """The exposure of flag j's removal from the failing cell at which, without another hang, the
    flag would be called early (flags_to_soak's test and level), found to policy.called_steps bisection
    steps (a hair long rather than short); `longest_s` when not even that would call it."""
    bit = 1 << j
    target = search.full & ~bit
    cell = search.stats_of(search.full)
    now = search.configs[target].exposure_s if target in search.configs else 0.0
    if cell.exposure_s <= 0:
        return now
    rows = strata_by_config(search, bit, minimal_mask)
    hangs = search.configs[target].hangs if target in search.configs else 0
    level = clear_level(search, minimal_mask)

    def called_at(exposure_s: float) -> bool:
        rows[target] = (cell.hangs, cell.exposure_s, hangs, exposure_s)
        c = compare(list(rows.values()), search.s.confidence)
        return called_early(c, hangs, level, search.policy.innocent_hangs)

    low, high = now, max(longest_s, now)
    if called_at(low):
        return low
    if not called_at(high):
        return high
    for _ in range(search.policy.called_steps):
        mid = (low + high) / 2.0
        low, high = (low, mid) if called_at(mid) else (mid, high)
    return high


def called_early(c, removal_hangs: int, level: float, innocent_hangs: int) -> bool:
    """A flag's comparison calls it before its soaks are done: at `level`, and either slower
    without it or on `innocent_hangs`+ hangs of its removal (a removal that hung once, quickly, is
    no call that the flag slows the hang)."""
    return c.p_value <= level and (c.ratio >= 1 or removal_hangs >= innocent_hangs)


def clear_level(search: Search, minimal_mask: int) -> float:
    """The level at which a flag is called early: a third of its Holm share, so that looking after
    every soak does not spend the family's error budget on the innocent flags."""
    outside = search.n - bin(minimal_mask).count("1")
    return (1.0 - search.s.confidence) / (search.policy.clear_share * max(outside, 1))


def rules_out(search: Search, cs, cleared: set[int]) -> bool:
    """The config's hangs against the failing cell's rule out "an x rule_out_factor modifier is
    among the flags it lacks" at a third of 1 - confidence (looked at after every soak). The call
    stands once made (`cleared`, added to here): the level holds for the first crossing, and the
    failing cell's later hangs (its top-up to policy.cell_hangs) would otherwise take it back by chance
    and send each flag of the group to soaks of its own."""
    if cs.mask in cleared:
        return True
    cell = search.stats_of(search.full)
    if cs.hangs < 2 or cell.hangs == 0:
        return False
    p = p_as_strong([(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s)], search.s.rule_out_factor)
    if p <= (1.0 - search.s.confidence) / search.policy.group_rule_out_share:
        cleared.add(cs.mask)
        return True
    return False


def cleared_flags(search: Search, minimal_mask: int, cleared: set[int]) -> int:
    """Flags outside the set removed together with others in a config whose hangs rule out an
    x rule_out_factor modifier among them (a group's removal, _group_check)."""
    out = 0
    for m, cs in search.configs.items():
        gone = search.full & ~m
        if (m & minimal_mask) != minimal_mask or bin(gone).count("1") < 2:
            continue
        if rules_out(search, cs, cleared):
            out |= gone
    return out


def flags_to_soak(search: Search, minimal_mask: int, longest_s: float, cleared: set[int]) -> list[int]:
    """Flags outside the set whose verdict more soaking of their removal may still change."""
    p = search.policy
    comps = comparisons(search, minimal_mask, interval=False)
    clear = clear_level(search, minimal_mask)
    out = []
    gone = cleared_flags(search, minimal_mask, cleared)
    for j, c in comps.items():
        if gone >> j & 1:
            continue
        target = search.full & ~(1 << j)
        if not search.runnable[target]:
            continue
        cs = search.configs.get(target)
        if cs is None:
            out.append(j)  # dropped with a group (ablation), not yet soaked alone
            continue
        if called_early(c, cs.hangs, clear, p.innocent_hangs):
            continue
        if cs.hangs >= p.measure_hangs or cs.exposure_s >= longest_s:
            continue
        if cs.hangs >= p.innocent_hangs and c.ratio < p.innocent_ratio:
            continue
        out.append(j)
    return out


def measure_length(search: Search) -> float:
    """The most a modifier verdict soaks one removal: the exposure in which a removal
    rule_out_factor x slower than the failing cell hangs policy.measure_hangs times, and some."""
    cell = search.stats_of(search.full)
    p = search.policy
    return search.s.rule_out_factor * cell.exposure_s / max(cell.hangs, 1) * (p.measure_hangs + p.measure_spare_hangs)


def reference_pool(search: Search, minimal_mask: int) -> tuple[float, float]:
    """Hangs and exposure of the failing cell pooled with every removal of flags outside the set
    (one flag, or a group that looks at most policy.innocent_ratio x slower) that its own comparison
    with the failing cell does not tell apart (policy.reference_level): the rate
    "x F slower than the failing cell" is read against. A removal that is slower (a modifier not
    yet called) only lowers the pooled rate and lengthens the rule-out; a faster one is left out."""
    cell = search.stats_of(search.full)
    h, e = float(cell.hangs), float(cell.exposure_s)
    for m, cs in search.configs.items():
        # removals of flags outside the set, alone or in groups (the ablation's and the groups')
        if m == search.full or (m & minimal_mask) != minimal_mask or cs.exposure_s <= 0 or cell.exposure_s <= 0:
            continue
        c = compare([(cell.hangs, cell.exposure_s, cs.hangs, cs.exposure_s)], search.s.confidence)
        # a group's removal joins only while it looks as fast (a modifier among its flags would slow
        # the reference, and each necessary flag's rule-out with it)
        p = search.policy
        if c.p_value > p.reference_level and (bin(search.full & ~m).count("1") == 1 or c.ratio < p.innocent_ratio):
            h, e = h + cs.hangs, e + cs.exposure_s
    return h, e
