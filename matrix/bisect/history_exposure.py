"""What the history store already measured on the failing cell, as free exposure for its bisection.

The nightly soaked the failing cell (same cell id, so same model, GPU, workload, flags and build)
before anyone asked for a bisection: its hangs of the target signature and its load are draws from
the very rate the calibration measures. They enter the failing cell's stats before the first probe,
so the calibration needs fewer new hangs (none when the history holds all it soaks for: the
calibration's, and without a cap the ablation's reference hangs of the failing cell) and the rate,
the default cap and the necessity soaks start from a tighter estimate.

A result counts with its load up to its hang or crash (another signature's crash ended that soak:
the load before it still counts, as in a probe); config and infrastructure errors carry no load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from soakmatrix.matrix.contracts.durations import format_duration

from .model import Settings

if TYPE_CHECKING:
    from .search import Search

LOADED = ("passed", "hang", "crash")  # the outcomes whose soaks carried load (a definition, not a tuning)


@dataclass(frozen=True)
class HistoryExposure:
    signature: str
    hangs: int  # results that ended with the target signature
    exposure_s: float  # load over every result with load
    results: int  # results that carried load
    runs: tuple[str, ...]  # their run ids, oldest first
    source: str = ""  # where else the load was measured (e.g. the build bisection's probes); "": the store


def history_exposure(observations: Iterable[Any], cell_id: str, signature: str | None) -> HistoryExposure | None:
    """The free exposure of `cell_id` for `signature` from recorded results (objects with run_id,
    cell_id, outcome, signature, exposure_s, time_to_hang_s, like `HistoryStore.observations()`);
    None without a target signature or without any load on record."""
    if signature is None:
        return None
    hangs, exposure, results, runs = 0, 0.0, 0, []
    for o in observations:
        outcome = getattr(o.outcome, "value", o.outcome)
        if o.cell_id != cell_id or outcome not in LOADED:
            continue
        load = float(o.exposure_s or 0.0)
        if outcome != "passed" and o.time_to_hang_s is not None:
            load = min(load, o.time_to_hang_s) if load else float(o.time_to_hang_s)
        if load <= 0:
            continue  # no load on record (a hang without its time to hang says nothing of the rate)
        hung = outcome != "passed" and o.signature == signature
        hangs += hung
        exposure += load
        results += 1
        if o.run_id not in runs:
            runs.append(o.run_id)
    if results == 0:
        return None
    return HistoryExposure(signature, hangs, exposure, results, tuple(runs))


def failing_hangs_wanted(settings: Settings) -> int:
    """How many hangs of the failing cell a bisection soaks it for at least: the calibration's; by
    default (ablation, no cap) the reference the necessity soaks read the rate from; and the ones
    the modifier verdicts' first group check compares with (policy.cell_first_hangs; up to policy.cell_hangs
    when a group does not clear, and more while they shorten the necessity soaks: not counted)."""
    wanted = settings.calibration_hangs
    if settings.ablation and settings.mttf_cap_s is None:
        wanted = max(wanted, settings.policy.reference_hangs)
    if settings.measure_modifiers:
        wanted = max(wanted, settings.policy.cell_first_hangs)
    return wanted


def calibration_saved(history: HistoryExposure, wanted_hangs: int, gpus: int, startup_s: float) -> float:
    """GPU-hours of soaking the failing cell the history spared: the hangs it gave that the bisection
    would otherwise have soaked for (`wanted_hangs`), each a start-up plus one MTTF (its expected
    time to hang) on `gpus`. The rest of its load (a tighter rate for every later stage) is not
    counted: a lower estimate."""
    if history.hangs == 0 or history.exposure_s <= 0:
        return 0.0
    mttf = history.exposure_s / history.hangs
    return min(history.hangs, wanted_hangs) * gpus * (startup_s + mttf) / 3600.0


def describe(history: HistoryExposure, saved_gpu_hours: float, wanted_hangs: int) -> str:
    """The report's sentence on what came from history and what it saved."""
    newest = ", ".join(reversed(history.runs[-3:]))
    runs = f"{len(history.runs)} run(s)" + (f" (newest {newest})" if history.runs else "")
    where = (
        f"{history.results} probe(s) of {history.source}"
        if history.source
        else f"{history.results} result(s) of this cell in {runs} of the store"
    )
    text = (
        f"history: {history.hangs} hang(s) of {history.signature} in {format_duration(history.exposure_s)} of "
        f"load from {where} entered as free exposure of the failing cell"
    )
    if history.hangs:
        left = max(wanted_hangs - history.hangs, 0)
        text += (
            f"; they spared ~{saved_gpu_hours:.1f} GPU-hours of soaking the failing cell "
            f"({min(history.hangs, wanted_hangs)} of the {wanted_hangs} hang(s) it is soaked for at least, at its MTTF, "
            f"start-up included" + (f"; {left} more were soaked for)" if left else ")")
        )
    else:
        text += "; no hang of the target among them: the calibration still soaks for every hang"
    return text


def take_history(search: Search, history: HistoryExposure, gpus: int) -> list[str]:
    """The history's hangs and load become the failing cell's before its calibration; the note says
    how much and what that spared."""
    if search.signature != history.signature:
        raise ValueError(f"the history is for {history.signature}, the bisection for {search.signature}")
    cs = search.stats_of(search.full)
    cs.role = "calibration"
    cs.hangs += history.hangs
    cs.exposure_s += history.exposure_s
    wanted = failing_hangs_wanted(search.s)
    return [describe(history, calibration_saved(history, wanted, gpus, search.s.startup_s), wanted)]


def to_json(history: HistoryExposure, saved_gpu_hours: float) -> dict[str, Any]:
    doc = {
        "signature": history.signature,
        "hangs": history.hangs,
        "exposure_s": round(history.exposure_s, 3),
        "results": history.results,
        "runs": list(history.runs),
        "saved_gpu_hours_estimate": round(saved_gpu_hours, 3),
    }
    if history.source:
        doc["source"] = history.source
    return doc
