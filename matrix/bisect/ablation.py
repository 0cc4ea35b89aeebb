"""Ablation, the search's first way: the failing cell without each flag (from
policy.group_ablation_flags flags on, without a group of them first, then halves of the groups
whose removal did not hang). Its necessity soaks are the shape of the lower bound (bound.py): the
evidence against "one flag fewer is enough" is the cost any procedure pays, and ablation spends
little else. By default (no cap) they also rule out "rule_out_factor x slower than the failing
cell" (benchmarks/bound_default.py) against the rate the modifier soaks pool for the failing cell
(modifier_reads.reference_pool). When ablation cannot decide, the posterior search
(posterior_search.py) goes on from every probe so far.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from soakmatrix.matrix.contracts import stats

from .modifier_reads import measure_length, reference_pool
from .modifiers import halves, measure, top_up_cell
from .posterior import Reference, exposure_until, p_as_fast
from .ratecheck import rate_check

if TYPE_CHECKING:
    from .search import Search


@dataclass(frozen=True)
class Ablation:
    """What ablation found: the kept set (None when it cannot decide, and why), the flags the rate
    check added to it, and the group removals its modifier soaks cleared (modifiers.measure)."""

    keep: int | None
    gave_up: str = ""
    rate_added: int = 0
    cleared: frozenset[int] = frozenset()


def ablation_search(search: Search, notes: list[str]) -> Ablation:
    """A removal that hangs drops its flags (the rest still holds the trigger), one that does not
    keeps them. Then baseline + the kept flags must hang (certification); each kept flag's absence
    is screened at a loose level (an innocent flag kept by an unlucky first soak hangs here); under
    an explicit cap the rate check looks for a flag outside the set that the rate needs; and each
    kept flag's absence is soaked until it rejects "as fast as the configs with the set" at
    alpha / (policy.necessity_split n). The kept set is None when ablation cannot decide (a
    removal that cannot run, every removal hanging, a kept set that does not hang and the rate
    check cannot say why: two triggers)."""
    s, p = search.s, search.policy
    keep, why = _ablate_each(search)
    if keep is None:
        return Ablation(None, why)
    rate_added = 0  # flags the rate check added: their absence hangs, slowly
    level = search.alpha / max(search.n, 1) / p.necessity_split
    # the rate check (a modifier the cap makes part of the set) runs once, between screen and
    # necessity, and only under an explicit cap: by default a flag without which the hang was seen
    # is a modifier, never part of the set
    guarded = s.modifier_prior <= 0 or s.mttf_cap_s is None
    rescued: set[int] = set()
    measured: set[int] = set()
    cleared: frozenset[int] = frozenset()  # group removals the modifier soaks cleared

    def done(kept: int | None, why: str = "") -> Ablation:
        return Ablation(kept, why, rate_added, cleared)

    while not search.over_budget():
        H, E = search.pooled(keep)
        search.track_cap(H, E)
        narrow = search.stats_of(keep)
        if narrow.hangs == 0:
            if keep == 0:
                return done(None, "every flag's removal still hung: two triggers, or the baseline hangs")
            if not search.runnable[keep]:
                return done(None, "baseline + the kept flags cannot run")
            if narrow.probes < p.certification_soaks:
                _certify(search, keep, H, E)
                continue
            # baseline + the set is slower than the configs with more flags: one of those is
            # needed for the rate (a modifier the cap makes part of the set) or holds a second
            # trigger; the rate check gets a few probes to find the first
            if keep in rescued or s.mttf_cap_s is None:
                return done(None, "baseline + the kept flags does not hang")
            rescued.add(keep)
            rescue_notes: list[str] = []
            grown, rate_cap = rate_check(search, keep, s.mttf_cap_s, rescue_notes, p.rescue_probes)
            if grown == keep or rate_cap is None:
                why = "baseline + the kept flags does not hang, and no one flag more makes it"
                return done(None, why)
            notes += rescue_notes
            rate_added |= grown & ~keep
            keep = grown
            continue
        goal = level if guarded else p.screen_level
        # by default the necessity soaks also rule out "only rule_out_factor x slower than the failing
        # cell without it" (seed 002's autotune: 8x), family-wise over the kept flags, against the
        # failing cell's own rate (the configs with the set mix in the modifiers' slower ones); the
        # screen asks only "as fast"
        factor = None
        if guarded and s.mttf_cap_s is None:
            if s.measure_modifiers and keep not in measured:
                # the modifier verdicts' soaks come first: their hangs (the failing cell's and each
                # innocent removal's) are the reference rate the rule-out soaks read
                measured.add(keep)
                cleared = measure(search, keep, measure_length(search), cleared)
                continue
            ref = _reference_of(search, keep)
            if ref.hangs < p.reference_hangs and top_up_cell(search, p.reference_hangs, reference=True):
                continue
            factor = (s.rule_out_factor, search.alpha, ref)
            if _another_reference_hang_pays(search, keep & ~rate_added, keep, H, E, goal, factor):
                top_up_cell(search, int(search.stats_of(search.full).hangs) + 1, reference=True)
                continue
        dropped, todo = _unrefuted(search, keep & ~rate_added, keep, H, E, goal, factor)
        if dropped:
            keep &= ~dropped
            continue
        if not todo and not guarded:
            guarded = True
            grown, _ = rate_check(search, keep, s.mttf_cap_s, notes)
            rate_added |= grown & ~keep
            keep = grown
            continue
        if not todo:
            return done(keep)
        batch: list[tuple[int, float, str]] = []
        for (j, need), n_copies in search.dealt(todo):
            target = search.full & ~(1 << j)
            if not search.runnable[target]:
                target = keep & ~(1 << j)
            if not search.runnable[target]:
                return done(None, f"no config without {search.elements[j].name} can run")
            # once the reference rate is fixed, a stage boundary buys no new information and costs a
            # start-up (an MTTF at MTTF 10 min); a hang ends the probe either way
            whole = factor is not None
            soak = max(need / n_copies if whole else min(need / n_copies, _stage(search, target)), s.startup_s)
            batch += [(target, soak, "search")] * n_copies
        search.run(batch)
    return done(None, "")


def _ablate_each(search: Search) -> tuple[int | None, str]:
    """The first round: the failing cell without a group of flags (policy.first_parts groups, then
    halves of those whose removal did not hang, down to single flags), one soak each (_stage, never
    longer than a config at the cap needs to show itself). Returns the flags whose removal did not
    hang, or None and why if a flag's removal cannot run."""
    s, p = search.s, search.policy
    keep = search.full
    longest = stats.soak_for_detection(search.post.cap, 1 - search.alpha / max(search.n, 1))
    everyone = list(range(search.n))
    grouped = search.n >= p.group_ablation_flags
    untested = _parts(everyone, p.first_parts) if grouped else [[j] for j in everyone]
    while untested and not search.over_budget():
        soak = max(min(_stage(search), longest), s.startup_s)
        batch: list[tuple[int, float, str]] = []
        groups: list[list[int]] = []
        while untested and len(batch) < max(1, s.parallel):
            group = untested.pop(0)
            target = search.full & ~sum(1 << j for j in group)
            if not search.runnable[target]:
                if len(group) == 1:
                    return None, f"the failing cell without {search.elements[group[0]].name} cannot run"
                untested += halves(group)
                continue
            stage = soak
            if grouped and len(group) == 1:
                # split out of a group whose removal did not hang: likelier a culprit, and a
                # culprit's longer soak more often is its necessity soak's last (a start-up fewer)
                stage = max(min(soak * p.single_stage_mttfs / p.ablation_stage_mttfs, longest), s.startup_s)
            batch.append((target, stage, "search"))
            groups.append(group)
        for group, (mask, result) in zip(groups, search.run(batch), strict=True):
            if result.hung_with(search.signature):
                keep &= mask
            elif len(group) > 1:
                untested += halves(group)
    return keep, ""


def _parts(flags: list[int], count: int) -> list[list[int]]:
    """`flags` in `count` groups of sizes as equal as can be (the larger first)."""
    count = max(1, min(count, len(flags)))
    size, extra = divmod(len(flags), count)
    starts = [i * size + min(i, extra) for i in range(count + 1)]
    return [flags[a:b] for a, b in itertools.pairwise(starts)]


def _certify(search: Search, keep: int, H: float, E: float) -> None:
    """Soak baseline + the kept flags long enough to see it hang if it is as fast as the
    configs with more flags (the slower of the pooled MTTF and the one read from every probe)."""
    mttf = max(E / max(H, 1.0), _stage(search) / search.policy.ablation_stage_mttfs)
    # with no cap the set alone may hang only rule_out_factor x slower (the modifiers left out of it)
    mttf = search.s.rule_out_factor * mttf if search.s.mttf_cap_s is None else min(mttf, search.post.cap)
    soak = stats.soak_for_detection(mttf, 1 - search.alpha / 2)
    soak = max(soak, search.policy.again_factor * search.stats_of(keep).longest_s)
    search.stats_of(keep).role = "certification"
    search.run([(keep, max(soak, search.s.startup_s), "certification")])


def _unrefuted(
    search: Search,
    flags: int,
    keep: int,
    H: float,
    E: float,
    goal: float,
    factor: tuple[float, float, Reference] | None = None,
) -> tuple[int, list[tuple[int, float]]]:
    """Of `flags` (all in `keep`): those whose absence was seen to hang (to drop), and the others
    whose absence has not yet rejected "as fast as the configs with `keep`" at `goal` (and, with
    `factor` = (F, alpha, reference), "F x slower than the reference rate" at _rule_out_level),
    with the exposure still needed, fewest first."""
    dropped = 0
    rows: list[tuple[int, float, float]] = []  # flag, exposure without it, exposure needed
    for j in range(search.n):
        if flags >> j & 1:
            h, e = search.lacking(keep, 1 << j)
            if h > 0:
                dropped |= 1 << j
            else:
                rows.append((j, e, exposure_until(0, e, H, E, goal) if p_as_fast(0, e, H, E) > goal else 0.0))
    if factor is not None and rows:
        f, alpha, ref = factor
        # no hang in e at rate lambda / f is no hang in e / f at lambda
        p = {j: ref.p_no_hang(e / f) for j, e, _ in rows}
        level = _rule_out_level(p, keep, dropped, alpha)
        rows = [
            (j, e, max(need, f * ref.exposure_until(e / f, level)) if p[j] > level else need) for j, e, need in rows
        ]
    todo = [(j, need - e) for j, e, need in rows if need > e]
    return dropped, sorted(todo, key=lambda t: t[1])


def _rule_out_level(p_no_hang: dict[int, float], keep: int, dropped: int, alpha: float) -> float:
    """The rule-outs' level: alpha / k for each of the k kept flags (Bonferroni). A step-down
    (Holm) is what the floor allows, but it cost seed 002 its 0.95 right: benchmarks/bench_bisect.py's
    --holm-least swaps this function for one, as a diagnostic."""
    return alpha / max(bin(keep).count("1"), 1)


def _another_reference_hang_pays(
    search: Search, flags: int, keep: int, H: float, E: float, goal: float, factor: tuple[float, float, Reference]
) -> bool:
    """Whether one more hang of the failing cell, in the rule-out's reference rate, would shorten
    the necessity soaks of `flags` still to run by more than it costs (an MTTF of load and a
    start-up): with two or three necessary flags the reference rate is worth more hangs than with one."""
    f, level, ref = factor
    if ref.hangs <= 0 or search.over_budget():
        return False
    mttf = ref.mttf()
    _, now = _unrefuted(search, flags, keep, H, E, goal, factor)
    _, then = _unrefuted(search, flags, keep, H, E, goal, (f, level, ref.plus_cell_hang(mttf)))
    saving = sum(need for _, need in now) - sum(need for _, need in then)
    return saving > mttf + search.s.startup_s


def _reference_of(search: Search, keep: int) -> Reference:
    """The failing cell's rate the rule-outs read: the pool of the failing cell and the removals
    that look like it."""
    h_ref, e_ref = reference_pool(search, keep)
    return Reference(h_ref, np.array([e_ref]), np.array([1.0]))


def _stage(search: Search, mask: int | None = None) -> float:
    """The longest soak the ablation gives one config at a time: policy.ablation_stage_mttfs x an
    MTTF that neither lucky early hangs nor the kept flags' passes can pull far off, and at least
    policy.again_factor x `mask`'s longest soak so far.

    The MTTF is the rate's maximum likelihood over every hang so far, each hang's time read as
    truncated at its probe's soak (read plainly, short soaks make the rate look fast, and short
    soaks come from a fast-looking rate). Passes do not count (a kept flag's removal never hangs);
    the MTTF read from every probe, passes included, bounds it from above."""
    again = search.policy.again_factor * search.configs[mask].longest_s if mask in search.configs else 0.0
    hangs = [(r.exposure_s, r.probe.soak_s) for r in search.log if r.hung_with(search.signature)]
    everything = sum(cs.exposure_s for cs in search.configs.values())
    slowest = everything / max(len(hangs), 1)
    if not hangs:
        return max(search.policy.ablation_stage_mttfs * slowest, again)
    t = np.array([h[0] for h in hangs])
    soak = np.array([max(h[1], h[0]) for h in hangs])
    rate = len(hangs) / max(float(t.sum()), 1e-9)
    for _ in range(50):
        # d/d rate of sum(ln rate - rate t - ln(1 - exp(-rate soak))) = 0, as a fixed point
        correction = soak / np.expm1(np.minimum(rate * soak, 700.0))
        new_rate = len(hangs) / float((t + correction).sum())
        if abs(new_rate - rate) <= 1e-9 * rate:
            break
        rate = new_rate
    return max(search.policy.ablation_stage_mttfs * min(1.0 / max(rate, 1e-12), slowest), again)
