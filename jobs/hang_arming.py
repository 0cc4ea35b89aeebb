"""Which hangs of a hang model an engine carries, and after how much exposure each fires.

One implementation for both places a hang is planted: the simulated engine (`sim/hangs.py`) and the
fault plugin in a real vLLM (`fixtures/fault_plugin.py`). A hang applies when its `when` matches the
engine's flags and its `gpu` (if any) lists the GPU type; it is armed with its effective MTTF
(`Hang.effective_mttf_s`, the modifiers applied) and one draw from an exponential distribution with
that mean, divided by the time scale. The draw's RNG is seeded by a namespace, the hang model's
`seed`, the engine's seed, the hang's id and (where a side gives one) the engine's identity, so one
engine with one command line always hangs at the same point of its load. Each side keeps its own
namespace: their draws stay what they have always been. How exposure accrues (the simulator's loop
time, the plugin's time between steps) is each side's own clock.

Flags are taken as given: the simulator fills in defaults first, while the plugin reads what the
real engine runs, where a flag its vLLM lacks is absent and so never matches.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the fault plugin imports this in every vLLM process: keep it light
    from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel


def draw_exposure(
    namespace: str,
    model_seed: int,
    seed: object,
    hang_id: str,
    mttf_s: float,
    time_scale: float = 1.0,
    identity: str = "",
) -> float:
    """Seconds of qualifying exposure before the hang fires: exponential, mean `mttf_s / time_scale`.
    `identity` (the engine's flags and GPU) keeps engines that share a seed from sharing a draw."""
    key = f"{namespace}:{model_seed}:{seed}:{hang_id}"
    rng = random.Random(f"{key}:{identity}" if identity else key)
    return rng.expovariate(1.0 / mttf_s) / time_scale


@dataclass
class Arming:
    """One hang that applies to this engine, with its effective MTTF (unscaled) and its draw (scaled)."""

    hang: Hang
    mttf_s: float
    fires_after_s: float


def applicable(
    model: HangModel,
    flags: Mapping[str, Any],
    gpu: str | None,
    styles: Collection[str] | None = None,
    build: tuple[int, str] | None = None,
) -> list[Hang]:
    """The hangs (of `styles`, if given) whose `when`, `gpu` and build match, in the file's order
    (a hang keyed on the build never matches an engine that does not know its build)."""
    return [h for h in model.hangs if (styles is None or h.style in styles) and h.matches(flags, gpu or None, build)]


def arm(
    model: HangModel,
    flags: Mapping[str, Any],
    gpu: str | None,
    seed: object,
    namespace: str,
    *,
    styles: Collection[str] | None = None,
    time_scale: float = 1.0,
    build: tuple[int, str] | None = None,
    identity: str = "",
) -> list[Arming]:
    """Every applicable hang with its effective MTTF and its seeded draw."""
    armed = []
    for hang in applicable(model, flags, gpu, styles, build):
        mttf = hang.effective_mttf_s(flags)
        armed.append(
            Arming(hang, mttf, draw_exposure(namespace, model.seed, seed, hang.id, mttf, time_scale, identity))
        )
    return armed
