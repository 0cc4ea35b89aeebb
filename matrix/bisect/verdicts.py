"""After the set is known: other values of its flags toward the baseline, and a verdict per flag.

A multi-valued flag of the set is tried at each alternative (TP 8 -> 4 -> 2, other choices) for the
certified soak. Each flag gets one verdict from every probe so far: necessary (in the set), a
modifier (the rate differs with and without it, among configs holding the set), irrelevant, or
context (it could not move from its failing value).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from soakmatrix.matrix.contracts import stats
from soakmatrix.matrix.contracts.durations import format_duration

from .model import Element, FlagVerdict, ValueProbe
from .modifier_stats import called, thin_speedup

if TYPE_CHECKING:
    from .search import Search


def shrink_values(
    search: Search, minimal_mask: int, alternatives: Mapping[str, Sequence[Any]], soak_s: float
) -> list[ValueProbe]:
    """Soak the minimal set with each alternative value of its flags; an integer flag stops at the
    first value that no longer hangs."""
    out: list[ValueProbe] = []
    for i, e in enumerate(search.elements):
        if not minimal_mask >> i & 1:
            continue
        for value in alternatives.get(e.name, ()):
            if search.over_budget():
                return out
            flags = search.flags_of(minimal_mask, **{e.name: value})
            reason = search.feasible(flags) if search.feasible else None
            if reason:
                out.append(ValueProbe(e.name, value, 0, 0.0, f"infeasible: {reason}"))
                continue
            label = f"{search.label(minimal_mask)} with {e.name}={value}"
            result, cs = search.run_aside(flags, soak_s, label, f"minimal set with {e.name}={value}")
            if result.outcome in ("config_error", "infra_error"):
                out.append(ValueProbe(e.name, value, 0, 0.0, f"{result.outcome}: {result.message}"))
                continue
            cs.exposure_s = result.exposure_s
            hung = result.hung_with(search.signature)
            cs.hangs = int(hung)
            cs.other_hangs = int(result.hung and not hung)
            if hung:
                out.append(ValueProbe(e.name, value, 1, result.exposure_s, "hangs"))
            else:
                bound = stats.mttf_lower_bound(result.exposure_s, search.s.confidence)
                out.append(
                    ValueProbe(
                        e.name,
                        value,
                        0,
                        result.exposure_s,
                        f"no hang in {format_duration(result.exposure_s)}: MTTF > {format_duration(bound)} "
                        f"at {search.s.confidence:.0%}",
                    )
                )
                if isinstance(value, int) and not isinstance(value, bool):
                    break  # a smaller TP/MTP is not tried once a larger one stopped hanging
    return out


def smallest_values(
    search: Search, minimal_mask: int, values: Sequence[ValueProbe], soak_s: float
) -> tuple[dict[str, Any], str]:
    """The smallest integer value of each flag of the set that still hung (TP 4 -> 2), checked together.

    One flag shrunk: its own shrink probe (the rest of the set at its failing values, the certified
    soak) is the shrunk set's certified soak. Several: the shrunk set is soaked once more, together,
    for the certified soak; if it does not hang, the failing values stand (the values may interact).
    Returns the overrides that stand and a sentence for the report ("" when nothing shrank)."""
    smallest: dict[str, Any] = {}
    for vp in values:
        failing = next(e.value for e in search.elements if e.name == vp.flag)
        if (
            vp.verdict == "hangs"
            and isinstance(vp.value, int)
            and not isinstance(vp.value, bool)
            and isinstance(failing, int)
            and abs(vp.value) < abs(smallest.get(vp.flag, failing))
        ):
            smallest[vp.flag] = vp.value
    if not smallest:
        return {}, ""
    shown = ", ".join(f"{k}={v}" for k, v in smallest.items())
    if len(smallest) == 1:
        ((name, value),) = smallest.items()
        vp = next(v for v in values if v.flag == name and v.value == value)
        return smallest, (
            f"the shrunk set ({shown}) hung after {format_duration(vp.exposure_s)} of its certified "
            f"soak of {format_duration(soak_s)}"
        )
    if search.over_budget():
        return {}, f"the shrunk set ({shown}) was not soaked together (budget): the failing values stand"
    flags = search.flags_of(minimal_mask, **smallest)
    result, cs = search.run_aside(
        flags, soak_s, f"{search.label(minimal_mask)} with {shown}", f"minimal set with {shown}"
    )
    hung = result.hung_with(search.signature)
    cs.hangs, cs.other_hangs, cs.exposure_s = int(hung), int(result.hung and not hung), result.exposure_s
    if hung:
        return smallest, (
            f"the shrunk set ({shown}) hung after {format_duration(result.exposure_s)} of its "
            f"certified soak of {format_duration(soak_s)}"
        )
    return {}, (
        f"the shrunk set ({shown}) did not hang in its certified soak of {format_duration(soak_s)}: "
        "the failing values stand"
    )


def flag_verdicts(
    search: Search,
    minimal_mask: int,
    context: Mapping[str, Any],
    context_elements: Sequence[Element],
    cap: float | None = None,
) -> list[FlagVerdict]:
    """One verdict per element, then one per context flag. Each follows what was seen:

    * necessary: no hang without it (in configs holding the rest of the set), with how far that was
      shown: the MTTF bound and its multiple of the failing cell's MTTF;
    * modifier: the hang was seen without it. A flag of the set (an explicit cap made it part of
      the set: needed to hang within the cap) says so; a flag outside the set is a modifier only
      when the stratified rate comparison (modifiers.py) calls it, Holm over the flags outside;
    * irrelevant otherwise; context for a flag that could not move; unmeasured for a flag outside
      the set when the modifier measurement was switched off (`--no-modifiers`)."""
    out: list[FlagVerdict] = []
    conf = search.s.confidence
    cell = search.stats_of(search.full)
    failing_mttf = cell.exposure_s / cell.hangs if cell.hangs else None
    calls = called(search, minimal_mask)
    for i, e in enumerate(search.elements):
        bit = 1 << i
        if minimal_mask & bit:
            h, exp = search.lacking(minimal_mask, bit)
            if h:
                hangs_with, exposure_with = search.pooled(minimal_mask)
                ratio = hangs_with / max(exposure_with, 1e-9) * exp / h
                within = f"; needed to hang within the cap {format_duration(cap)}" if cap else ""
                text = (
                    f"modifier x{ratio:.1f} (the hang was seen without it: {h} hang(s) in {format_duration(exp)}, "
                    f"MTTF ~{format_duration(exp / h)}{within})"
                )
                out.append(FlagVerdict(e, "modifier", text, ratio))
                continue
            bound = stats.mttf_lower_bound(exp, conf)
            times = f", > {bound / failing_mttf:.1f}x the failing cell" if failing_mttf else ""
            text = f"necessary (no hang in {format_duration(exp)} without it: MTTF > {format_duration(bound)} at {conf:.0%}{times})"
            out.append(FlagVerdict(e, "necessary", text))
            continue
        if not search.s.measure_modifiers:
            out.append(FlagVerdict(e, "unmeasured", "outside the set; not measured for a modifier (--no-modifiers)"))
            continue
        c, is_modifier = calls[i]
        interval = f"x{c.low:.2g}-x{c.high:.2g}" if math.isfinite(c.high) else f"x{c.low:.2g} or more"
        if is_modifier and math.isfinite(c.ratio) and c.ratio >= 1:
            text = (
                f"modifier x{c.ratio:.1f} (without it the hang comes {c.ratio:.1f}x less often, "
                f"{conf:.0%} CI {interval}, p={c.p_value:.2g})"
            )
        elif is_modifier and c.ratio < 1:
            text = (
                f"modifier x{c.ratio:.2f} (with it the hang comes {1 / max(c.ratio, 1e-9):.1f}x less often, "
                f"{conf:.0%} CI {interval}, p={c.p_value:.2g})"
            )
        elif is_modifier:
            text = f"modifier (no hang without it in {format_duration(c.exposure_without)}, p={c.p_value:.2g})"
        else:
            compared = f"p={c.p_value:.2g}" if c.hangs_with + c.hangs_without else "not compared"
            if thin_speedup(c, search.policy.speedup_hangs) and c.p_value <= 1.0 - conf:
                compared += (
                    f"; faster without it, but on {c.hangs_without} hang(s) without it: "
                    f"too few to call (a call that it comes faster without it needs {search.policy.speedup_hangs})"
                )
            out.append(FlagVerdict(e, "irrelevant", f"irrelevant ({compared})", _finite(c.ratio), c.p_value))
            continue
        if cap and is_modifier:
            text += f"; not needed to hang within the cap {format_duration(cap)}"
        out.append(FlagVerdict(e, "modifier", text, _finite(c.ratio), c.p_value, _finite(c.low), _finite(c.high)))
    for e in context_elements:
        out.append(FlagVerdict(e, "context", f"context (fixed at {e.value!r}: {context.get(e.name, '')})"))
    return out


def _finite(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None
