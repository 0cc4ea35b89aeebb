"""The posterior search: every set of flags at once, when removing one flag at a time cannot decide.

It goes on from every probe so far: it picks the config whose outcome tells most per expected
GPU-hour (`choose`) and soaks it until its first hang or until "it is fast" has dropped to
alpha / (expected remaining probes), and stops when the likeliest set has posterior >= confidence,
every config it says is slow was soaked in full, each of its flags passes the necessity check at
alpha / n, and the set itself was seen to hang. A default cap follows the MTTF pooled over the
likeliest set's configs (`Search.track_cap`).
"""

from __future__ import annotations

import math

import numpy as np

from soakmatrix.matrix.contracts import stats

from .posterior import exposure_until, p_as_fast, subset_sums
from .search import Search


def _h2(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def posterior_search(search: Search) -> None:
    """Probe until the stop of the module docstring holds (or the budget is spent)."""
    s = search.s
    full_soaked: set[int] = set()  # configs soaked at least once without staging
    necessity_soaks: dict[int, int] = {}  # element -> soaks the necessity check asked for
    while not search.over_budget():
        lp = search.post.log_posterior()
        if search.s.mttf_cap_s is None:
            lp = _follow_cap(search, lp)
        top = int(np.argmax(lp))
        p_top = math.exp(lp[top])
        if p_top >= s.confidence:
            doubtful = _staged_passes(search, top, full_soaked)
            if doubtful is not None:
                # the answer leans on a config that only ever passed a staged soak, read on a
                # rate from a handful of hangs: soak it in full before believing it is slow
                H, E = rate_pool(search, lp)
                p_c = np.array([float(np.exp(lp)[search.post.subsets_of(doubtful)].sum())])
                soak = float(_soak_for(search, np.maximum(p_c, 0.5), H, E, search.alpha / 2)[0])
                full_soaked.add(doubtful)
                search.run([(doubtful, soak, "search")])
                continue
            unproven = _unproven_necessity(search, top, lp, necessity_soaks)
            if unproven is not None:
                full_soaked.add(unproven[0])
                search.run([(unproven[0], unproven[1], "search")])
                continue
            if search.stats_of(top).hangs > 0:
                return
            # certification: the answer itself must be seen to hang
            H, E = rate_pool(search, lp)
            soak = stats.soak_for_detection(E / H, 1 - search.alpha / 2)
            soak = min(soak, stats.soak_for_detection(search.post.cap, 1 - search.alpha / 2))
            if not search.runnable[top]:
                return
            search.stats_of(top).role = "certification"
            search.run([(top, soak, "certification")])
            continue
        remaining = max(1.0, float(-(np.exp(lp) * lp / math.log(2)).sum()))
        delta = search.alpha / (remaining + 1.0) ** search.s.probe_correction
        batch = []
        hallucinated: list[tuple[int, int, float]] = []
        for _ in range(max(1, s.parallel)):
            mask, soak, staged = choose(search, lp, delta)
            if not staged:
                full_soaked.add(mask)
            batch.append((mask, soak, "search"))
            if len(batch) < s.parallel:
                # imagine the likelier outcome so the next pick in the batch asks something new
                p_fast = float(np.exp(lp)[search.post.subsets_of(mask)].sum())
                H, E = rate_pool(search, lp)
                hang = p_fast > 0.5
                hallucinated.append((mask, int(hang), E / H if hang else soak))
                search.post.observe(mask, int(hang), E / H if hang else soak)
                lp = search.post.log_posterior()
        for mask, h, e in hallucinated:
            search.post.observe(mask, -h, -e)
        search.run(batch)


def choose(search: Search, lp: np.ndarray, delta: float) -> tuple[int, float, bool]:
    """The config whose outcome tells most per expected GPU-hour, its soak, and whether that soak
    is staged (shortened while the rate is vague: a pass then needs a full soak before the stop)."""
    n = search.n
    p_fast = np.clip(subset_sums(np.exp(lp), n), 0.0, 1.0)
    H, E = rate_pool(search, lp)
    mttf = E / H
    settling = _soak_for(search, p_fast, H, E, delta)
    soak = settling
    if search.policy.stage_hangs > H:
        # lambda is still vague: refuting a config now would take a soak of many MTTFs that
        # positives (which pool more hangs) will soon shorten; soak a few MTTFs and come back
        soak = np.minimum(settling, max(search.policy.stage_mttfs * mttf, search.s.startup_s))
    detect = 1.0 - (E / (E + soak)) ** H
    p_hang = p_fast * detect
    info = _h2(p_hang) - p_fast * _h2(detect)
    expected_load = p_fast * mttf * detect + (1 - p_hang) * soak
    cost = search.cost * (search.s.startup_s + expected_load)
    score = np.where(search.runnable, info / cost, -np.inf)
    best = int(np.argmax(score))
    # staged only if the clip shortened this soak: a pass of the soak that settles the
    # question needs no second, full soak before the stop
    return best, float(soak[best]), bool(soak[best] < settling[best])


def _soak_for(search: Search, p_fast: np.ndarray, H: float, E: float, delta: float) -> np.ndarray:
    """Soak after which, without a hang, P(fast) falls to delta (lambda ~ Gamma(H, E))."""
    odds = np.clip(p_fast, 1e-12, 1 - 1e-12) / np.clip(1 - p_fast, 1e-12, None)
    factor = np.maximum(odds * (1 - delta) / delta, 1.0 + 1e-9)
    soak = E * (factor ** (1.0 / H) - 1.0)
    mttf = E / H
    # a hypothesis at the cap is the slowest that still counts: never soak longer than that needs
    longest = search.post.cap * np.log(1.0 / delta)  # soak_for_detection(cap, 1 - delta)
    # every probe pays its start-up: a soak much shorter than that buys little
    shortest = max(search.policy.min_soak_mttfs * mttf, search.s.startup_s)
    return np.clip(soak, shortest, np.maximum(longest, shortest))


def rate_pool(search: Search, lp: np.ndarray) -> tuple[float, float]:
    k = int(np.argmax(lp))
    return float(search.post.H[k]), float(search.post.E[k])


def _staged_passes(search: Search, top: int, full_soaked: set[int]) -> int | None:
    """A config that top says is slow, never hung, and was only ever soaked while the rate was
    vague (staged), or None."""
    for mask, cs in search.configs.items():
        if (
            top & ~mask
            and cs.hangs == 0
            and cs.exposure_s > 0
            and mask not in full_soaked
            and search.runnable[mask]
            and cs.role == "search"
        ):
            return mask
    return None


def _unproven_necessity(
    search: Search, top: int, lp: np.ndarray, necessity_soaks: dict[int, int]
) -> tuple[int, float] | None:
    """A flag of `top` whose absence was not yet soaked long enough to reject, on its own and
    at alpha / n, "as fast as the configs with top": the config to soak and for how long.

    The posterior's stop leans on its prior, which favours larger sets (there are more of
    them), and each innocent flag probed is one more chance for an unlucky pass of a fast
    config; this test is the prior-free guard, Bonferroni over the n flags. Hangs without the
    flag in the wider configs may come from another trigger: then the narrowest config
    (baseline + top without the flag) must show the slowdown itself. `necessity_soaks` counts the
    soaks asked for each flag (policy.necessity_soaks at most)."""
    H, E = rate_pool(search, lp)
    level = search.alpha / max(search.n, 1)
    for j in range(search.n):
        bit = 1 << j
        if not top & bit or necessity_soaks.get(j, 0) >= search.policy.necessity_soaks:
            continue
        rest = top & ~bit
        h, e = search.lacking(top, bit)
        if p_as_fast(h, e, H, E) <= level:
            continue
        target = search.full & ~bit
        if h > 0:
            narrow = search.configs.get(rest)
            h, e = (narrow.hangs, narrow.exposure_s) if narrow else (0, 0.0)
            if p_as_fast(h, e, H, E) <= level:
                continue
            target = rest
        if not search.runnable[target]:
            continue
        necessity_soaks[j] = necessity_soaks.get(j, 0) + 1
        return target, max(exposure_until(h, e, H, E, level) - e, search.s.startup_s)
    return None


def _follow_cap(search: Search, lp: np.ndarray) -> np.ndarray:
    """A default cap tracks the MTTF pooled over the likeliest set's configs (more hangs than
    the calibration alone, so a tighter bound). It may rise to policy.cap_rise x the calibration's:
    two lucky early calibration hangs would otherwise hold the cap far below the real MTTF
    and make every later hang look slow."""
    return search.post.log_posterior() if search.track_cap(*rate_pool(search, lp)) else lp
