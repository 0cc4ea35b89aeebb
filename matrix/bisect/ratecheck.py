"""The rate check: is the set enough to hang within the cap, or does the rate need one flag more?

The search's model gives every config that contains the set one shared rate. The rate check lets
the rate drop by a factor without one flag outside the set (ModifierModel) and soaks the configs
that tell until it is sure whether the hang without that flag is slower than the cap (the flag then
joins the set, and each flag the search had put there is asked again with it on: recheck_members).
"The set is enough" also needs a prior-free Bayes factor of 2 / alpha against the mildest slowdown
that would make a flag needed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from scipy import special

from soakmatrix.matrix.contracts import stats
from soakmatrix.matrix.contracts.durations import format_duration

if TYPE_CHECKING:
    from .search import Search


class ModifierModel:
    """The rate may drop by a factor r (policy.modifier_factors) without one flag j outside the set:
    hypotheses `none` (prior 1 - Settings.modifier_prior) and (j, r), each with a closed-form
    likelihood (a 1/lambda prior) in the hangs and exposure of the configs containing the set,
    split by j. Under (j, r), j is *needed* when the hang without it is slower than the cap
    (r / lambda > cap_j, cap_j derived from the configs with j when no cap was given). "Enough"
    also needs the prior-free guard (`enough`): a few lucky quick hangs can tip the prior's "none"."""

    def __init__(self, search: Search, mask: int, candidates: list[int], cap: float | None):
        self.search, self.mask, self.candidates, self.cap = search, mask, candidates, cap
        rows = [
            (m, cs.hangs, cs.exposure_s) for m, cs in search.configs.items() if (m & mask) == mask and cs.exposure_s > 0
        ]
        self.H = float(sum(h for _, h, _ in rows))
        self.E = float(sum(e for _, _, e in rows))
        factors = search.policy.modifier_factors
        J, R = len(candidates), len(factors)
        self.r = np.array(factors)
        HA = np.array([sum(h for m, h, _ in rows if m >> j & 1) for j in candidates], dtype=float)
        EA = np.array([sum(e for m, _, e in rows if m >> j & 1) for j in candidates], dtype=float)
        HB, EB = self.H - HA, self.E - EA
        self.HA, self.EA, self.HB, self.EB = HA, EA, HB, EB
        Eeff = EA[:, None] + EB[:, None] / self.r[None, :]  # J x R
        self.Eeff = np.maximum(Eeff, 1e-9)
        log_ml = -HB[:, None] * np.log(self.r)[None, :] - self.H * np.log(self.Eeff)
        log_none = -self.H * math.log(max(self.E, 1e-9))
        q = search.s.modifier_prior
        prior_j = math.log(q / max(J * R, 1)) if q > 0 else -math.inf
        logs = np.concatenate([[math.log(1 - q) + log_none], (prior_j + log_ml).ravel()])
        w = np.exp(logs - logs.max())
        w /= w.sum()
        self.p_none = float(w[0])
        self.post = w[1:].reshape(J, R)
        if cap is not None:
            caps = np.full(J, cap)
        else:
            caps = np.array(
                [search.cap_from(ha, ea) if ha > 0 else search.initial_cap for ha, ea in zip(HA, EA, strict=True)]
            )
        self.caps = caps
        # P(lambda < r / cap_j): the hang without j is slower than the cap
        self.p_slow = special.gammainc(max(self.H, 1e-9), self.r[None, :] / caps[:, None] * self.Eeff)
        self.needed = (self.post * self.p_slow).sum(axis=1)  # per candidate
        # the guard's Bayes factor per candidate: "enough" (no slowdown, or x2: two triggers in
        # the failing cell halve the rate without one of them) against the mildest slowdown of the
        # grid that would make it needed; a candidate that no slowdown of the grid makes needed
        # (a generous explicit cap) needs no guard
        enough = self.search.policy.enough_factor
        log_x2 = -HB * math.log(enough) - self.H * np.log(np.maximum(EA + EB / enough, 1e-9))
        log_enough = np.logaddexp(log_none, log_x2) - math.log(2.0)
        needs = self.p_slow > 0.5
        mildest = np.argmax(needs, axis=1)
        self.log_bf_enough = np.where(needs.any(axis=1), log_enough - log_ml[np.arange(J), mildest], np.inf)

    @property
    def p_enough(self) -> float:
        return 1.0 - float(self.needed.sum())

    def enough(self, alpha: float) -> bool:
        """P(the set is enough) >= 1 - alpha, and for every candidate j the data favour "at most
        x2 slower without j" over "slower by the grid's mildest factor that makes j needed" by a
        Bayes factor of 2 / alpha or more. Under a true slowdown at least that large, that factor
        is a supermartingale, so luck passes the guard with probability at most alpha / 2 (Ville's
        inequality), whatever the prior: half the error budget, as for the certification run.
        A modifier prior of 0 turns the rate check off, guard included."""
        guarded = self.search.s.modifier_prior > 0 and self.log_bf_enough.size
        if guarded and float(self.log_bf_enough.min()) < math.log(2.0 / alpha):
            return False
        return self.p_enough >= 1 - alpha

    def choose(self) -> tuple[int, float] | None:
        """The config and soak whose outcome tells most about which flag (if any) is needed, per
        expected GPU-hour."""
        s = self.search
        lam_none = max(self.H, 0.5) / max(self.E, 1e-9)
        lam = np.maximum(self.H, 0.5) / self.Eeff  # J x R
        mttf = 1.0 / lam_none
        # each (j, r) splits into "j needed" and "the set is enough"
        need = self.post * self.p_slow
        enough = self.post * (1 - self.p_slow)

        def joint(q_none: float, q: np.ndarray) -> np.ndarray:
            """P(answer, an outcome of probability q), answer 0 = the set is enough, 1 + i = candidate i."""
            return np.concatenate([[self.p_none * q_none + (enough * q).sum()], (need * q).sum(axis=1)])

        options = {self.mask}
        for j in self.candidates:
            options.add(self.mask | 1 << j)
            options.add(s.full & ~(1 << j))
        best, best_score = None, 0.0
        for c in sorted(options):
            if not s.runnable[c]:
                continue
            has = np.array([c >> j & 1 for j in self.candidates], dtype=bool)
            rate = np.where(has[:, None], lam, lam / self.r[None, :])  # J x R
            for k in s.policy.modifier_soaks:
                soak = k * mttf
                p_h_none, p_h = -math.expm1(-lam_none * soak), -np.expm1(-rate * soak)
                info = _mutual_information(joint(p_h_none, p_h), joint(1 - p_h_none, 1 - p_h))
                mean_load_none = (1 - math.exp(-lam_none * soak)) / lam_none
                load = self.p_none * mean_load_none + float((self.post * (-np.expm1(-rate * soak) / rate)).sum())
                score = info / (s.cost[c] * (s.s.startup_s + load))
                if score > best_score:
                    best, best_score = (c, soak), score
        return best


def _mutual_information(joint_h: np.ndarray, joint_n: np.ndarray) -> float:
    total = joint_h.sum() + joint_n.sum()
    if total <= 0:
        return 0.0
    joint = np.stack([joint_h, joint_n]) / total
    py = joint.sum(axis=0, keepdims=True)
    po = joint.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(joint > 0, joint * np.log2(joint / (po * py)), 0.0)
    return float(terms.sum())


def _settle(
    search: Search, mask: int, candidates: list[int], cap: float | None, max_probes: int | None = None
) -> tuple[ModifierModel, bool]:
    """Soak what the modifier model picks until it decides (the set is enough, or a candidate is
    needed). Returns the last model and whether it decided (not: the probe or GPU-hour budget)."""
    max_probes = search.policy.max_modifier_probes if max_probes is None else max_probes
    alpha = 1.0 - search.s.confidence
    for probes in range(max_probes + 1):
        model = ModifierModel(search, mask, candidates, cap)
        if model.enough(alpha) or model.needed.max() >= 1 - alpha:
            return model, True
        if probes >= max_probes or search.over_budget():
            break
        pick = model.choose()
        if pick is None:
            break
        # copies of one config are independent soaks whose exposure pools: with --parallel N the
        # rate check's serial chain (mostly the set alone, until it has hung often enough) takes
        # 1/N of the rounds for a hang or so of overshoot per batch
        search.run([(pick[0], pick[1], "rate check")] * max(1, search.s.parallel))
    return model, False


def rate_check(
    search: Search, mask: int, cap: float | None, notes: list[str], max_probes: int | None = None
) -> tuple[int, float | None]:
    """A flag outside the set without which the hang is slower than the cap is needed for the hang
    *within the cap*: soak the configs that tell until the modifier model is sure either way, and
    add such a flag. Returns the grown set and, with a default cap, the cap the configs that share
    the set's rate give (None: undecided)."""
    alpha = 1.0 - search.s.confidence
    cap_out = cap if cap is not None else search.post.cap
    for _ in range(search.n):
        candidates = [j for j in range(search.n) if not mask >> j & 1]
        if not candidates:
            break
        model, decided = _settle(search, mask, candidates, cap, max_probes)
        if not decided:
            notes.append(
                f"the rate check stopped undecided (probe or GPU-hour budget): P(the set is "
                f"enough to hang within the cap) = {model.p_enough:.3f}"
            )
            return mask, None
        if model.enough(alpha):
            if cap is None:
                cap_out = search.cap_from(model.H, model.E)
            break
        i = int(np.argmax(model.needed))
        j = candidates[i]
        cap_j = float(model.caps[i])
        r = float((model.post[i] * np.array(search.policy.modifier_factors)).sum() / max(model.post[i].sum(), 1e-12))
        notes.append(
            f"{search.elements[j].name} is needed to hang within the cap: without it the hang is "
            f"~x{r:.0f} slower (MTTF beyond the cap {format_duration(cap_j)}; "
            f"P = {model.needed[i]:.3f})"
        )
        mask |= 1 << j
        cap_out = cap_j if cap is None else cap
    return mask, cap_out


def recheck_members(search: Search, found: int, grown: int, cap: float | None, notes: list[str]) -> tuple[int, bool]:
    """The rate check grew `found` to `grown`: is each flag of `found` still needed with the added
    flags on? (The search read configs without an added flag, which hang slowly whatever else is on.)
    Each flag gets the rate check's question with the rest of `grown` fixed. Returns the set and
    whether every flag was decided."""
    alpha = 1.0 - search.s.confidence
    added = ", ".join(e.name for j, e in enumerate(search.elements) if (grown & ~found) >> j & 1)
    for i in range(search.n):
        bit = 1 << i
        if not found & bit:
            continue
        rest = grown & ~bit
        model, decided = _settle(search, rest, [i], cap)
        if not decided:
            notes.append(
                f"the rate check stopped undecided whether {search.elements[i].name} is still needed "
                f"(probe or GPU-hour budget): P(not needed) = {model.p_enough:.3f}"
            )
            return grown, False
        if model.enough(alpha):
            notes.append(
                f"{search.elements[i].name} is not needed once {added} is in the set: baseline + the "
                f"set without it hangs as fast (P = {model.p_enough:.3f})"
            )
            grown = rest
    return grown, True


def soak_the_set_alone(search: Search, mask: int, cap: float) -> None:
    """Baseline + the set gets at least policy.modifier_evidence_hangs hangs: they are the "without" side
    of every other flag's modifier verdict at once. The rate check's guard usually saw more; under
    a generous explicit cap it has nothing to guard and the set alone may have hung only once."""
    cs = search.stats_of(mask)
    while (
        cs.hangs
        and cs.hangs < search.policy.modifier_evidence_hangs
        and search.runnable[mask]
        and not search.over_budget()
    ):
        soak = stats.soak_for_detection(min(cs.exposure_s / cs.hangs, cap), search.s.confidence)
        before = cs.hangs
        search.run([(mask, max(soak, search.s.startup_s), "certification")])
        if cs.hangs == before:
            return
