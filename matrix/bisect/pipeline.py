"""The flag bisection from start to end, in phases: `bisect_flags` is the one entry.

1. calibrate: soak the failing cell to its first hangs; its MTTF, the cap, the posterior;
2. search: ablation first, the posterior search over every set when it cannot decide;
3. cap and rate: drop what the cap calls modifiers, and (with an explicit cap) add what the rate
   needs and ask each flag again;
4. modifier soaks: what the modifier verdicts and the rule-outs read;
5. verdicts: other values of the set's flags, a verdict per flag, the result.

Each phase is a function over the probe ledger (search.py) and what the phase before handed on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from soakmatrix.matrix.contracts import stats

from .ablation import Ablation, ablation_search
from .cap_check import drop_modifiers, observed_without
from .history_exposure import HistoryExposure, take_history
from .model import (
    DEFAULT_SETTINGS,
    BisectResult,
    Element,
    FeasibleFn,
    FlagVerdict,
    GpuCountFn,
    Settings,
    ValueProbe,
    default_cap,
    default_gpu_count,
)
from .modifier_reads import measure_length
from .modifiers import measure
from .oracle import ProbeOracle
from .oracle_restart import RestartingOracle, other_signatures, restart_notes
from .posterior_search import posterior_search
from .ratecheck import rate_check, recheck_members, soak_the_set_alone
from .search import Search
from .verdicts import flag_verdicts, shrink_values, smallest_values


@dataclass(frozen=True)
class Calibration:
    """Whether the failing cell hung with the target signature, its MTTF, the search's first cap."""

    reproduced: bool
    failing: stats.MttfEstimate | None
    cap: float


@dataclass(frozen=True)
class Answer:
    """What the search hands on: the set (a mask), found or inconclusive, the cap its hang must come
    within, its posterior, the flags the rate check added, the groups the modifier soaks cleared."""

    top: int
    status: str
    cap: float
    posterior: float
    rate_added: int = 0
    cleared: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Verdicts:
    """The set's MTTF and certified soak, its flags' other values tried (and the smaller ones that
    stand), a verdict per flag."""

    minimal_mttf: stats.MttfEstimate | None = None
    certified_soak_s: float | None = None
    values: list[ValueProbe] = field(default_factory=list)
    shrunk: dict[str, Any] = field(default_factory=dict)
    per_flag: list[FlagVerdict] = field(default_factory=list)


def bisect_flags(
    failing_flags: Mapping[str, Any],
    elements: Sequence[Element],
    oracle: ProbeOracle,
    settings: Settings = DEFAULT_SETTINGS,
    *,
    signature: str | None = None,
    context: Mapping[str, str] | None = None,
    context_elements: Sequence[Element] = (),
    alternatives: Mapping[str, Sequence[Any]] | None = None,
    feasible: FeasibleFn | None = None,
    gpu_count: GpuCountFn = default_gpu_count,
    progress: Callable[[str], None] | None = None,
    signature_source: str = "",
    history: HistoryExposure | None = None,
) -> BisectResult:
    """Find the smallest set of `elements` that, over the baseline, hangs like the failing cell.

    `failing_flags` is the failing cell's full flag dict; `elements` the flags that may move to
    their baseline value; `context` names flags that cannot move and why (`context_elements`).
    `alternatives[name]` lists values to try, in order toward the baseline, once the set is known.
    `signature`: count only hangs with this signature (default: the calibration's first hang, never
    a crash; `signature_source` says where it came from). `history`: what the history store
    measured on the failing cell for that signature (history_exposure.py)."""
    if history is not None and signature is None:
        signature, signature_source = history.signature, signature_source or "the history store"
    s = settings
    if s.verify_cap is None:
        s = replace(s, verify_cap=s.mttf_cap_s is not None)
    # another signature restarts the server instead of ending the probe: the target as the search
    # knows it (none before the calibration's first hang: then only a hang ends a probe)
    restarting = RestartingOracle(oracle, lambda: search.signature, s.policy)
    search = Search(failing_flags, elements, restarting, s, signature, feasible, gpu_count, progress)
    said_history = take_history(search, history, gpu_count(failing_flags)) if history is not None else []
    notes: list[str] = []  # what each phase says, in order, for the report
    calibration = calibrate(search, notes)

    if not calibration.reproduced:
        answer, verdicts = Answer(0, "not_reproduced", math.nan, 0.0), Verdicts()
    else:
        answer = search_for_the_set(search, calibration.cap, notes)
        answer = check_cap_and_rate(search, answer, notes)
        soak_for_modifiers(search, answer)
        verdicts = give_verdicts(search, answer, notes, alternatives, context or {}, context_elements)
    configs = list(search.configs.values()) + search.extra_configs
    said = said_history + notes + restart_notes(restarting, configs, search.log)
    if not signature:
        signature_source = "the first hang of the calibration" if search.signature else ""
    return _result(search, calibration, answer, verdicts, said, context or {}, signature_source)


def calibrate(search: Search, notes: list[str]) -> Calibration:
    """Phase 1: the failing cell soaked to its first hangs; on a hang, the cap and the posterior."""
    s = search.s
    ok, _ = search.calibrate()
    cal = search.stats_of(search.full)
    failing = cal.mttf(s.confidence) if cal.exposure_s > 0 else None
    if not ok:
        bound = stats.mttf_lower_bound(cal.exposure_s, s.confidence)
        notes.append(
            f"the failing cell did not hang with the expected signature in {cal.exposure_s:.0f}s of load: "
            f"MTTF > {bound:.0f}s at {s.confidence:.0%}; nothing to bisect"
        )
        return Calibration(False, failing, math.nan)
    cap = s.mttf_cap_s if s.mttf_cap_s else default_cap(cal.hangs, cal.exposure_s, s.cap_factor, s.policy)
    if cal.hangs < s.calibration_hangs:
        notes.append(f"calibration stopped at {cal.hangs} hang(s) (budget): the MTTF interval is wide")
    search.start_posterior(cap)
    return Calibration(True, failing, cap)


def search_for_the_set(search: Search, cap: float, notes: list[str]) -> Answer:
    """Phase 2: the likeliest set, found when the search can vouch for it and it was seen to hang."""
    ablation = Ablation(0 if search.n == 0 else None)
    if search.n and search.s.ablation:
        ablation = ablation_search(search, notes)
        if ablation.keep is None and not search.over_budget():
            notes.append(
                f"removing one flag at a time could not decide ({ablation.gave_up}): "
                "searched every set of flags instead, with every probe so far"
            )
            search.progress(notes[-1])
    if ablation.keep is None:
        posterior_search(search)
    lp = search.post.log_posterior() if search.n else np.zeros(1)
    top = int(np.argmax(lp)) if ablation.keep is None else ablation.keep
    decided = ablation.keep is not None or math.exp(lp[top]) >= search.s.confidence
    cap = search.post.cap if search.n else cap
    p_top = float(np.exp(lp[top]))
    status = "found" if decided and search.stats_of(top).hangs > 0 else "inconclusive"
    if status == "inconclusive":
        notes.append(
            f"stopped by the probe or GPU-hour budget: the best set has posterior {p_top:.3f} < {search.s.confidence}"
        )
    return Answer(top, status, cap, p_top, ablation.rate_added, ablation.cleared)


def check_cap_and_rate(search: Search, answer: Answer, notes: list[str]) -> Answer:
    """Phase 3: flags leave the set (cap_check.py); an explicit cap asks for the set that hangs
    *within* it, so a flag without which the hang is slower joins it (its verdict still says the
    hang was seen without it), and each flag is asked again (ratecheck.py)."""
    s = search.s
    top, status, cap, rate_added = answer.top, answer.status, answer.cap, answer.rate_added
    if status == "found" and s.verify_cap:
        top = drop_modifiers(search, top, cap, notes)
    if status == "found" and s.mttf_cap_s is None:
        top = observed_without(search, top, notes)
    if status == "found" and s.mttf_cap_s is not None:
        grown, rate_cap = rate_check(search, top, s.mttf_cap_s, notes)
        if rate_cap is None:
            status = "inconclusive"
        rate_added |= grown & ~top
        if grown != top:
            top, decided = recheck_members(search, top, grown, s.mttf_cap_s, notes)
            if not decided:
                status = "inconclusive"
            if search.stats_of(top).hangs == 0 and search.runnable[top] and not search.over_budget():
                H, E = float(search.post.H[top]), float(search.post.E[top])
                search.run([(top, stats.soak_for_detection(min(E / max(H, 1.0), cap), s.confidence), "certification")])
            if search.stats_of(top).hangs == 0:
                status = "inconclusive"
                notes.append("the grown set was not seen to hang in its certification run")
    return Answer(top, status, cap, answer.posterior, rate_added, answer.cleared)


def soak_for_modifiers(search: Search, answer: Answer) -> None:
    """Phase 4: the soaks the modifier verdicts read (the set alone under an explicit cap; the
    flags outside the set, modifiers.py)."""
    s = search.s
    if answer.status == "found" and s.modifier_prior > 0 and s.mttf_cap_s is not None:
        soak_the_set_alone(search, answer.top, answer.cap)
    if answer.status == "found" and s.measure_modifiers:
        measure(search, answer.top, measure_length(search), answer.cleared)


def give_verdicts(
    search: Search,
    answer: Answer,
    notes: list[str],
    alternatives: Mapping[str, Sequence[Any]] | None,
    context: Mapping[str, str],
    context_elements: Sequence[Element],
) -> Verdicts:
    """Phase 5: the set's MTTF and certified soak, other values of its flags, a verdict per flag."""
    s, elements = search.s, search.elements
    top, status, cap = answer.top, answer.status, answer.cap
    outside = [cs for m, cs in search.configs.items() if cs.hangs and (m & top) != top]
    if outside:
        notes.append(
            "hangs with this signature were also seen in configs without this set ("
            + "; ".join(cs.label for cs in outside)
            + "): another trigger (an OR of conditions) or a modifier may exist; this is one minimal set, "
            "others may exist"
        )
    H, E = float(search.post.H[top]), float(search.post.E[top])
    minimal_est = stats.mttf_estimate(int(H), E, s.confidence) if E > 0 else None
    certified = None
    if H > 0:
        upper = stats.mttf_upper_bound(int(H), E, s.confidence)
        certified = float(stats.soak_for_detection(min(upper, cap) if status == "found" else upper, s.confidence))
    values: list[ValueProbe] = []
    shrunk: dict[str, Any] = {}
    if status == "found" and s.shrink_values and alternatives and certified:
        values = shrink_values(search, top, alternatives, certified)
        shrunk, said = smallest_values(search, top, values, certified)
        if said:
            notes.append(said)
    per_flag = flag_verdicts(search, top, context, context_elements, cap if s.mttf_cap_s is not None else None)
    speedup = math.prod(
        v.ratio
        for v in per_flag
        if v.kind == "modifier" and v.ratio and 1 < v.ratio < math.inf and not top >> elements.index(v.element) & 1
    )
    if certified and speedup > 1:
        # the regression test runs the set alone, without the modifiers that make the hang come sooner
        certified *= speedup
        notes.append(f"certified soak lengthened x{speedup:.1f}: the set alone runs without its modifiers")
    return Verdicts(minimal_est, certified, values, shrunk, per_flag)


def _result(
    search: Search,
    calibration: Calibration,
    answer: Answer,
    verdicts: Verdicts,
    notes: list[str],
    context: Mapping[str, str],
    signature_source: str,
) -> BisectResult:
    elements, top, found = search.elements, answer.top, answer.status == "found"
    return BisectResult(
        status=answer.status,
        signature=search.signature,
        elements=list(elements),
        context=dict(context),
        minimal=[e.name for i, e in enumerate(elements) if top >> i & 1],
        posterior=answer.posterior,
        confidence=search.s.confidence,
        mttf_cap_s=answer.cap,
        failing=calibration.failing,
        minimal_mttf=verdicts.minimal_mttf,
        certified_soak_s=verdicts.certified_soak_s,
        verdicts=list(verdicts.per_flag),
        configs=list(search.configs.values()) + search.extra_configs,
        values=list(verdicts.values),
        probes=search.probes,
        gpu_hours=search.gpu_hours,
        notes=notes,
        log=search.log,
        minimal_flags=search.flags_of(top, **verdicts.shrunk) if found else {},
        gpu_hours_by_role=dict(search.spent),
        rate_added=[e.name for i, e in enumerate(elements) if (top & answer.rate_added) >> i & 1],
        signature_source=signature_source,
        other_signatures=other_signatures(search.log, search.signature),
        shrunk={name: {"from": search.failing[name], "to": value} for name, value in verdicts.shrunk.items()},
    )
