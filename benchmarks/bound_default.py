"""The least GPU-hours any flag bisection must spend on the question the default settings answer.

`matrix/bisect/bound.py` bounds the old question (is each flag of the set needed to hang at all, t against "the
set without t hangs as fast"). By default `necessary` says more: no target hang was seen
without the flag, soaked until a slowdown up to F = `Settings.rule_out_factor` (8) is ruled out at
the stated confidence c; and each flag outside the set gets a `modifier` verdict, family-wise at
1 - c. Family-wise control bounds the chance of at least one false call; several can come
together, so it bounds one irrelevant flag's false call by 1 - c and no tighter, even with the
flags exchangeable (an earlier version took (1 - c) / (n - k) per flag, which does not follow: the
modifier floor at n=10, k=2, MTTF 38 min was 76.4 GPU-hours with it, 71.5 without). Same argument (Kaufmann, Cappe and Garivier, JMLR 2016, Lemma 1: the expected log-likelihood
ratio of two worlds, summed over what the procedure chose to observe, is at least d(p, p'), the
binary relative entropy of the probabilities with which it gives one answer in each), for the
benchmark's plain conjunction T of k among n flags hanging at rate lambda (MTTF units below:
lambda = 1), and for the same with one flag u outside T an x F modifier (without u the configs
holding T hang F times slower).

* **Necessity, against an x F modifier.** World W'': the configs holding T but not t hang too,
  F times slower than the configs holding T (at a common rate beta that the procedure has to learn,
  as in bound.py). Calling t necessary there is wrong, and t is not exchangeable with the flags
  outside the set (it changes the rate), so the procedure may do it with probability up to 1 - c,
  no less: the evidence is d(c, 1 - c). Per unit of load, a config without t (rate 0 in W, beta / F
  in W'') gives beta / F; Y MTTFs of load on the configs holding T give Y (beta - 1 - ln beta);
  the worst beta leaves  **Y ln(1 + X / (F Y)) >= d(c, 1 - c)**,  i.e.  X >= F Y (e^{d/Y} - 1):
  F times the load of bound.py's constraint for the same evidence. With the rate known (Y large),
  X = F d(c, 1 - c): 36 MTTFs at c = 0.99, 21 at 0.95 (a procedure that must always call a
  necessary flag necessary pays F ln(1 / (1 - c)), 24 at 0.95; d(c, 1 - c) allows it to give up
  now and then). bound.py's own constraint (t irrelevant; error share (1 - c) / (n - k + 1)) still
  holds; each flag needs the larger of the two.
* **Modifier verdicts, plain world.** A flag u outside T called a modifier: at most 1 - c of the
  time when all n - k are irrelevant (family-wise: no tighter per flag), at least c of the time when
  u is an x F modifier (how the default is meant to tell seed 002's autotune). In
  the plain world the evidence against "u is an x F modifier" (its configs with u at a, without at
  a / F, a free) is d(1 - c, c); with A the load on configs holding T and u, B on those
  holding T but not u, the worst a = (A + B) / (A + B / F) gives B ln F - (A + B) ln(a), and the
  loads that hold T are the ones that hang: the failing cell holds every u and baseline + T none,
  so one split of Y serves every u at once. The least Y that can carry it is Y_m; the floor asks
  Y >= Y_m.
* **Modifier world.** Y1 MTTFs of load on configs holding T and u (rate 1), Y0 on those without u
  (rate 1 / F). Calling u a modifier with probability c against "u irrelevant" (every rate mu,
  P <= 1 - c) needs -(Y1 + Y0 / F) ln(mu) - (Y0 / F) ln F >= d(c, 1 - c),
  mu = (Y1 + Y0 / F) / (Y1 + Y0). The necessity constraint reads Y1 + Y0 / F (the expected hangs:
  information about a rate is proportional to it), and the rate of a config without t is taken
  at its highest (beta / F), which only lowers the floor.
* **Cost.** k X + (load that hangs) + start-ups: one per hang (every hang ends a probe) and, with
  probability at least 2c - 1, one per class of configs without a flag of the set.
  Left out, so a floor and not an estimate: the search for T (and for which flag is the
  modifier), calibration, and that the procedure must hold for every MTTF and every k.
* **Checked to cost nothing more** (`other_flags_split`): in the modifier world the question also
  asks that another x F modifier be called (against W_uv, both u and v modifiers), that u not be
  called when v is the modifier (W_v), and that the set alone hang (against T + v, T + w as two
  triggers). The floor's loads, split over the failing cell, the set plus u, the failing cell
  without u and the set alone, meet all three in every benchmark row, so the floor already holds
  for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import brentq, minimize_scalar

from soakmatrix.matrix.bisect.bound import binary_divergence, refute_load

LARGEST_MTTFS = 2000.0     # the optimum's loads stay far below this (tens of MTTFs)


@dataclass(frozen=True)
class DefaultBound:
    gpu_hours: float          # the least expected GPU-hours
    hang_mttfs: float         # load on configs that hold T (with the modifier, if any), in MTTFs
    slow_mttfs: float         # load on configs that hold T but not the modifier (0 without one)
    refute_mttfs: float       # X: load without each flag of the set, in MTTFs, per flag
    rule_out_evidence: float  # d(c, 1 - c): against "without t, F x slower"
    same_evidence: float      # d(c, (1 - c) / (n - k + 1)): bound.py's, against "without t, as fast"
    modifier_evidence: float  # what the modifier verdicts need (plain: d(1 - c, c); modifier world: d(c, 1 - c))
    modifier_hang_mttfs: float   # Y_m: the least load on configs holding T the plain world's verdicts need


def rule_out_load(hang_mttfs: float, factor: float, evidence: float) -> float:
    """X, in MTTFs, such that Y ln(1 + X / (F Y)) = evidence: F times bound.py's `refute_load`."""
    return factor * refute_load(hang_mttfs, evidence)


def split_information(with_u: float, without_u: float, factor: float) -> float:
    """Plain world (every config holding T at rate 1): the least expected log-likelihood ratio
    against "u is an x factor modifier" (with u at a, without at a / factor, a free) from loads
    `with_u` and `without_u` (MTTFs) on configs holding T with and without u."""
    total = with_u + without_u
    if without_u <= 0 or total <= 0:
        return 0.0
    return without_u * math.log(factor) - total * math.log(total / (with_u + without_u / factor))


def detect_information(with_u: float, without_u: float, factor: float) -> float:
    """Modifier world (with u at rate 1, without at 1 / factor): the least expected log-likelihood
    ratio against "u irrelevant" (every config holding T at one rate mu, mu free)."""
    hangs = with_u + without_u / factor
    if without_u <= 0 or hangs <= 0:
        return 0.0
    mu = hangs / (with_u + without_u)
    return -hangs * math.log(mu) - without_u / factor * math.log(factor)


def plain_modifier_load(factor: float, evidence: float) -> float:
    """Y_m: the least load on configs holding T whose best split between "with u" and "without u"
    carries `evidence` against an x factor modifier (one split serves every u)."""
    def best(y: float) -> float:
        r = minimize_scalar(lambda z: -split_information(y - z, z, factor), bounds=(0.0, y), method="bounded",
                            options={"xatol": 1e-9 * max(y, 1.0)})
        return -float(r.fun)
    hi = 1.0
    while best(hi) < evidence:
        hi *= 2.0
    return brentq(lambda y: best(y) - evidence, 1e-9, hi, xtol=1e-9)


def default_floor(n: int, k: int, mttf_s: float, startup_s: float, confidence: float, factor: float = 8.0,
                  modifier: bool = False, gpus: int = 1) -> DefaultBound:
    """The least expected GPU-hours to answer the default question (module docstring) for k
    culprits among n flags with probability `confidence`; `modifier`: one flag outside the set is
    an x `factor` modifier (the benchmark's `+x8 mod` rows)."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    if factor <= 1:
        raise ValueError(f"the rule-out factor must be above 1, got {factor}")
    if modifier and n - k < 1:
        raise ValueError(f"a modifier needs a flag outside the set: k={k}, n={n}")
    c, alpha = confidence, 1.0 - confidence
    sigma = startup_s / mttf_s
    d_rule = binary_divergence(c, alpha)
    outside = n - k         # the flags outside T: exchangeable while all are irrelevant
    # bound.py's wrong supersets "T - t + v": n - k + 1 of them, one fewer when the modifier is among them
    d_same = binary_divergence(c, alpha / (n - k + 1 if not modifier else n - k))
    per_flag_startups = k * (2 * c - 1) * sigma

    def refute(y_eff: float) -> float:
        return max(refute_load(y_eff, d_same), rule_out_load(y_eff, factor, d_rule))

    if not modifier:
        d_mod = binary_divergence(alpha, c) if outside else 0.0
        y_m = plain_modifier_load(factor, d_mod) if outside else 0.0

        def cost(y: float) -> float:
            return k * refute(y) + y * (1.0 + sigma) + per_flag_startups

        best = minimize_scalar(cost, bounds=(max(y_m, 0.05), LARGEST_MTTFS), method="bounded",
                               options={"xatol": 1e-7})
        y = float(best.x)
        return DefaultBound(gpus * float(best.fun) * mttf_s / 3600.0, y, 0.0, refute(y), d_rule, d_same, d_mod, y_m)

    d_mod = binary_divergence(c, alpha)
    # with u's configs without it observed for ever, the evidence per MTTF of load without u tends to
    # 1 - (1 + ln F) / F: the least load without u that can carry it
    z_least = d_mod / (1.0 - (1.0 + math.log(factor)) / factor)

    def inner(z: float) -> tuple[float, float]:
        """The cheapest Y1 for this Y0 = z, and its cost."""
        y_least = brentq(lambda y: detect_information(y, z, factor) - d_mod, 1e-12, LARGEST_MTTFS * 10, xtol=1e-10)

        def cost(y1: float) -> float:
            y_eff = y1 + z / factor
            return k * refute(y_eff) + y1 + z + sigma * y_eff + per_flag_startups

        r = minimize_scalar(cost, bounds=(y_least, max(y_least, LARGEST_MTTFS)), method="bounded",
                            options={"xatol": 1e-7})
        return float(r.x), float(r.fun)

    outer = minimize_scalar(lambda z: inner(z)[1], bounds=(z_least * (1 + 1e-6), LARGEST_MTTFS), method="bounded",
                            options={"xatol": 1e-6})
    z = float(outer.x)
    y1, mttfs = inner(z)
    return DefaultBound(gpus * mttfs * mttf_s / 3600.0, y1, z, refute(y1 + z / factor), d_rule, d_same, d_mod, 0.0)


# -- what the floor's constraints leave out, and why it costs nothing (modifier world) --------------

def _kl(rate: float, other: float) -> float:
    """Per MTTF of load, the expected log-likelihood ratio of a Poisson process at `rate` against
    one at `other`."""
    return rate * math.log(rate / other) - rate + other


def _least_over_rate(information) -> float:
    """The least of `information(x)` over the alternative's free rate x > 0."""
    r = minimize_scalar(lambda lx: information(math.exp(lx)), bounds=(-20.0, 20.0), method="bounded",
                        options={"xatol": 1e-9})
    return float(r.fun)


def second_modifier_information(both: float, only_u: float, only_v: float, neither: float, factor: float) -> float:
    """Modifier world W_u (configs holding T and u at rate 1, without u at 1 / F) against W_uv, where
    another flag v outside T is an x F modifier too (with u and v at x, without one of them x / F,
    without both x / F^2, x free): the least expected log-likelihood ratio from loads (MTTFs) on
    configs holding T with both flags, u only, v only, neither."""
    f = factor
    return _least_over_rate(lambda x: both * _kl(1.0, x) + only_u * _kl(1.0, x / f)
                            + only_v * _kl(1.0 / f, x / f) + neither * _kl(1.0 / f, x / (f * f)))


def swapped_modifier_information(both: float, only_u: float, only_v: float, neither: float, factor: float) -> float:
    """W_u against W_v, where v and not u is the x F modifier (with v at x, without x / F, x free)."""
    f = factor
    return _least_over_rate(lambda x: both * _kl(1.0, x) + only_u * _kl(1.0, x / f)
                            + only_v * _kl(1.0 / f, x) + neither * _kl(1.0 / f, x / f))


def other_flags_split(bound: DefaultBound, n: int, k: int, confidence: float, factor: float = 8.0,
                      steps: int = 400) -> tuple[float, float, float, float] | None:
    """A split of the modifier world's optimum (Y1 = `bound.hang_mttfs` with u, Y0 = `bound.slow_mttfs`
    without) over the failing cell (both), the set plus u (only u), the failing cell without u (only
    v, for every other flag v) and the set alone (neither) that also meets three requirements of
    the question which `default_floor`'s constraints leave out; None when no split on the grid does.

    * Another x F modifier v would be called one with probability c, and v, irrelevant here, is
      called one at most 1 - c of the time (family-wise control bounds no single flag tighter):
      against W_uv the evidence is d(1 - c, c).
    * v, not u, being the modifier (W_v), u is called one at most 1 - c of the time there:
      d(c, 1 - c).
    * The set alone hangs (it is the answer): were T without two flags v, w outside it unable to hang
      (T + v and T + w two triggers), returning T is wrong; the two worlds differ only on configs
      lacking both, so with probability at least 2c - 1 one of them hangs, and with u among the
      two that is a config without u, at 1 / F: by Wald's identity, at least (2c - 1) F MTTFs of
      load on them (the set alone serves every pair at once).
    A split that meets all three at the same Y1 and Y0 leaves the floor's cost as it is: the floor
    already holds for them."""
    outside = n - k
    y1, y0 = bound.hang_mttfs, bound.slow_mttfs
    if outside < 2:
        return (y1, 0.0, y0, 0.0)
    c, alpha = confidence, 1.0 - confidence
    alone = (2.0 * c - 1.0) * factor
    if y0 < alone:
        return None
    d_second = binary_divergence(alpha, c)
    d_swapped = binary_divergence(c, alpha)
    neither, only_v = alone, y0 - alone
    for i in range(steps + 1):
        only_u = y1 * i / steps
        both = y1 - only_u
        # (pairs of flags without u: a hang of the set plus u, at rate 1, serves them all)
        if (only_u >= 2.0 * c - 1.0
                and second_modifier_information(both, only_u, only_v, neither, factor) >= d_second
                and swapped_modifier_information(both, only_u, only_v, neither, factor) >= d_swapped):
            return (both, only_u, only_v, neither)
    return None
