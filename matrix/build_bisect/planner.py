"""Which build to soak next, and for how long: the most information about the change point per
expected GPU-hour.

A soak of build i for L seconds splits the hypotheses at i. Under a hypothesis J <= i (build i is
bad) it passes with probability f_J(L) = (E_J / (E_J + L))^H_J, H_J and E_J the hangs and exposure
that J pools over the builds it calls bad (the rate integrated out, as in the posterior: a
hypothesis whose builds passed long soaks has a slow rate, so further passes refute it only
polynomially). A hang is conclusive (every J above i goes); a pass scales each J <= i by f_J(L).
The expected drop in the entropy of the change point, over the expected cost (start-up, plus about
min(T, L) of load on a bad build and L on a good one), ranks every build and every length of a small
grid of multiples of the MTTF pooled over the builds known bad. This is the Bayesian noisy binary
search of Flake Aware Culprit Finding (Henderson et al., ICST 2023), with soak lengths chosen
instead of fixed and a hang read as a time, not a bit.

The end game (`_end_game`): when the pick is the build just below the likeliest group, refuting it
is what is left. It is soaked once for the whole length **confidence demands** (the pass after which
that group reaches the stated confidence; chunks only add start-ups, a bad build hangs as early
either way), unless one more hang pooled on a bad build would shorten that soak by more than the
hang costs, or the likeliest first bad build's hypothesis pools fewer hangs than `min_pooled_hangs`:
then that build is soaked to its hang first (the floor's trade, bound.py: hangs on bad builds
against load on the good neighbour).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LENGTH_GRID = (0.5, 1.0, 2.0, 4.0, 8.0)  # soak lengths tried, in pooled MTTFs
MAX_SOAK_MTTFS = 60.0  # the length confidence demands is not tried beyond this
POOL_SOAK_MTTFS = 10.0  # a soak to pool one more hang on a bad build stops at its hang
# A hang's time is read in these bins (fractions of the soak's length) when a probe is scored: a rate
# is told by when hangs come, not only whether one came within the soak (an old rate 4 x lower and the
# new one both hang within a long soak, at different times); a clean regression's hang is conclusive
# whenever it comes, so there the bins change little.
HANG_BINS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)


def min_pooled_hangs(confidence: float) -> int:
    """The hangs the end game pools on the likeliest first bad build before it refutes the build
    below: the log-odds (nats) the stop asks for, rounded up, the floor's trade (bound.py: about
    d(c, 1 - c) hangs on bad builds). With fewer, the refuting soak's length rests on a rate read
    from a few hangs; it comes out short exactly when they came early (the rate overestimated), and
    that is where the misses were (n = 8, MTTF 2 h: 0.989 exact over 1500 seeds without it, 0.993
    with it, at no more GPU-hours). 6 at a stop of 0.995, 4 at 0.975."""
    return math.ceil(math.log(confidence / (1.0 - confidence)))


@dataclass(frozen=True)
class Choice:
    index: int  # the build to soak
    soak_s: float
    gain_bits: float  # expected drop in the entropy of the change point
    cost_hours: float  # expected GPU-hours
    p_bad: float  # P(this build is bad)
    role: str = "search"  # search | refute (the end game's soak) | pool (a hang on a bad build)


def _plogp(p: np.ndarray) -> np.ndarray:
    safe = np.where(p > 0, p, 1.0)
    return np.where(p > 0, p * np.log(safe), 0.0)


Passes = Callable[..., tuple[np.ndarray, np.ndarray]]
"""passes(length, extra=None) -> per group, P(J in it and a soak of that length passes) when the
soaked build is bad under it and when it is good (`ChangePointPosterior.group_passes`)."""


def pass_factor(hangs: np.ndarray, exposure: np.ndarray, length: float) -> np.ndarray:
    """f_J(L): the chance that a bad build passes L under each hypothesis, rate integrated out."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(exposure > 0, (exposure / (exposure + length)) ** hangs, 0.0)


def stop_length(
    mass: np.ndarray, best: int, passes: Passes, confidence: float, extra: tuple[int, float, float] | None = None
) -> float | None:
    """The pass length on the build just below group `best` that brings it to `confidence`; None
    when no pass can (too much mass above it) or it already has. After a pass of L the groups below
    keep their bad-build pass mass, `best` and those above their good-build one (all of it for a
    clean regression, less where the build below may hang at an old rate)."""
    p = float(mass[best])
    if p >= confidence or best == 0:
        return None
    odds = (1.0 - confidence) / confidence

    def left(length: float) -> float:
        bad, good = passes(length, extra)
        # a hair beyond the exact length, so the pass lands at the confidence, not a rounding under it
        allowed = (float(good[best]) * odds - float(good[best + 1 :].sum())) * (1.0 - 1e-6)
        return float(bad[:best].sum()) - allowed

    if float(mass[best]) * odds - float(mass[best + 1 :].sum()) <= 0:
        return None  # a pass takes no mass off the groups above: no length is enough
    lo, hi = 0.0, max(float(mass.size), 1.0) * 3600.0
    while left(hi) > 0:
        hi *= 2.0
        if hi > 1e12:
            return None
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if left(mid) > 0 else (lo, mid)
    return hi


def choose(
    groups: list[tuple[int, int]],
    mass: np.ndarray,
    passes: Passes,
    pool_hangs: np.ndarray,
    mttf_s: float,
    startup_s: float,
    confidence: float,
    gpus: int = 1,
    aimed: int | None = None,
) -> Choice | None:
    """The next probe, or None when no probe can tell the groups apart. `passes`: the posterior's
    pass masses per group (`Passes`); `pool_hangs`: the hangs each group's clean regression pools;
    `mttf_s`: the rate after the change point (sets the grid and the cost); `aimed` (`aim_at`): the
    likeliest group of a rate change, whose build and the one below are the only ones probed."""
    if len(groups) < 2 or not mttf_s > 0 or not math.isfinite(mttf_s):
        return None
    total_entropy = -float(_plogp(mass).sum())
    # a probe of group k's last build, k = 0..len - 1: groups 0..k call it bad; the newest build
    # (k = len - 1) splits no hypothesis but tells the rate after the change point, which a rate
    # change's hypotheses differ on (a clean regression's only through their pooled rates)
    cum_p = np.cumsum(mass)
    newest = np.arange(len(groups)) == len(groups) - 1
    best: Choice | None = None
    best_ratio = -math.inf
    survival = {0.0: (mass, mass)}
    for factor in LENGTH_GRID:
        length = factor * mttf_s
        times = [0.0, *(f * length for f in HANG_BINS), length]
        for t in times[1:]:
            if t not in survival:
                survival[t] = passes(t)
        # outcomes: a hang in each bin of times, or a pass of the whole length; per group, its mass
        # and that outcome, when the soaked build is bad under it and when it is good
        outcomes = [
            (np.maximum(survival[a][0] - survival[b][0], 0.0), np.maximum(survival[a][1] - survival[b][1], 0.0))
            for a, b in itertools.pairwise(times)
        ] + [survival[length]]
        after = np.zeros(len(groups))  # expected entropy after the probe of group k's last build
        for bad, good in outcomes:
            # a probe of group k's last build: groups 0..k call it bad, those above good
            z = np.cumsum(bad) + _suffix(good)
            s_ = np.cumsum(_plogp(bad)) + _suffix(_plogp(good))
            after += _plogp(z) - s_
        gain = total_entropy - after
        # expected load: the integral of the chance that it has not hung by t, over 0..length
        alive = [np.cumsum(survival[t][0]) + _suffix(survival[t][1]) for t in times]
        load = sum(0.5 * (b - a) * (alive[j] + alive[j + 1]) for j, (a, b) in enumerate(itertools.pairwise(times)))
        cost = gpus * (startup_s + load) / 3600.0
        ratio = np.where((cum_p > 1e-12) & ((cum_p < 1.0 - 1e-12) | newest), gain / cost, -math.inf)
        if aimed is not None:
            ratio = np.where(np.isin(np.arange(ratio.size), (aimed - 1, aimed)), ratio, -math.inf)
        k = int(np.argmax(ratio))
        if ratio[k] > best_ratio:
            best_ratio = float(ratio[k])
            best = Choice(groups[k][1], length, float(gain[k]) / math.log(2), float(cost[k]), float(cum_p[k]))
    if best is None or not math.isfinite(best_ratio):
        return None
    top = int(np.argmax(mass))
    if top == 0 or best.index != groups[top - 1][1]:
        return best
    return _end_game(best, groups, mass, top, passes, pool_hangs, mttf_s, startup_s, confidence, gpus)


def aim_at(groups: list[tuple[int, int]], mass: np.ndarray, hangs: np.ndarray, threshold: float) -> int | None:
    """The group the search aims at, or None: the likeliest one when it holds `threshold` of the
    posterior and the target hung below it (a rate change). Then only the build just below it (its
    rate must be shown low) and its own first build (high) are probed: load on the build below
    refutes every change point under it at once, and the builds further down tell only the old rate.
    A clean regression never has a hang below its likeliest group, so its search is untouched."""
    top = int(np.argmax(mass))
    if top == 0 or mass[top] < threshold or not hangs[: groups[top][0]].sum():
        return None
    return top


def _suffix(x: np.ndarray) -> np.ndarray:
    """sum of x[k + 1:] for each k < len(x) (0 for the last)."""
    return np.append(np.cumsum(x[::-1])[::-1][1:], 0.0)


def _end_game(
    best: Choice,
    groups: list[tuple[int, int]],
    mass: np.ndarray,
    top: int,
    passes: Passes,
    pool_hangs: np.ndarray,
    mttf_s: float,
    startup_s: float,
    confidence: float,
    gpus: int,
) -> Choice:
    stop = stop_length(mass, top, passes, confidence)
    if stop is None:
        return best
    b = float(mass[:top].sum())
    # one more hang on a bad build pools into every hypothesis at or below the likeliest group
    pooled = stop_length(mass, top, passes, confidence, extra=(groups[top][1], 1.0, mttf_s))
    if pool_hangs[top] < min_pooled_hangs(confidence) or (
        pooled is not None and (1.0 - b) * (stop - pooled) > startup_s + mttf_s
    ):
        return Choice(
            groups[top][1], POOL_SOAK_MTTFS * mttf_s, 0.0, gpus * (startup_s + mttf_s) / 3600.0, 1.0 - b, "pool"
        )
    if stop > MAX_SOAK_MTTFS * mttf_s:
        return best
    load = b * mttf_s * -math.expm1(-stop / mttf_s) + (1.0 - b) * stop
    return Choice(best.index, stop, best.gain_bits, gpus * (startup_s + load) / 3600.0, b, "refute")


def planning_mttf(post, groups: list[tuple[int, int]], mass) -> float:
    """The MTTF the planner sizes soaks with: pooled over the builds known bad; where a hang below the
    likeliest change point says the hang is old there (a rate change), over the builds from it on."""
    top = groups[int(mass.argmax())][0]
    h, e = post.hangs(), post.exposure()
    low = post.lowest_bad()
    if low is not None and low < top and h[top:].sum() > 0:
        low = top
    if low is None or not h[low:].sum():
        return math.nan
    return float(e[low:].sum() / h[low:].sum())
