"""When the simulated engine hangs: exponential time to hang, accrued only under enough load.

Each hang of the hang model whose `when` matches the engine's (default-filled) flags and GPU is
*armed* with its own time to hang, drawn once from an exponential distribution whose mean is
`Hang.effective_mttf_s(flags)` (the modifiers applied) divided by the time scale. The draw uses a
seeded RNG (the hang model's `seed`, the engine's `--seed` and the hang's id), so one command line
always hangs at the same point of its load. A hang's clock runs only while at least its
`min_running` requests are running; the first hang whose clock passes its draw fires.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping, Sequence

from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel


def hang_rng(model_seed: int, seed: int, hang_id: str) -> random.Random:
    return random.Random(f"soakmatrix-sim-hang:{model_seed}:{seed}:{hang_id}")


def draw_time_to_hang(hang: Hang, flags: Mapping[str, object], model_seed: int, seed: int,
                      time_scale: float = 1.0) -> float:
    """Wall seconds of qualifying load before `hang` fires (exponential, mean MTTF / time_scale)."""
    full = flagmod.resolve_defaults(flags)
    mttf = hang.effective_mttf_s(full)
    return hang_rng(model_seed, seed, hang.id).expovariate(1.0 / mttf) / time_scale


@dataclass
class ArmedHang:
    hang: Hang
    mttf_s: float          # effective MTTF, unscaled (seconds of engine time)
    fires_after_s: float   # wall seconds of qualifying load (scaled)
    accrued_s: float = 0.0

    @property
    def remaining_s(self) -> float:
        return self.fires_after_s - self.accrued_s


def arm(model: HangModel, flags: Mapping[str, object], gpu: str | None, seed: int,
        time_scale: float = 1.0) -> list[ArmedHang]:
    full = flagmod.resolve_defaults(flags)
    armed = []
    for hang in model.active(full, gpu or None):
        armed.append(ArmedHang(hang, hang.effective_mttf_s(full),
                               draw_time_to_hang(hang, full, model.seed, seed, time_scale)))
    return armed


class HangClock:
    """Accrues load time per armed hang and says which fires first."""

    def __init__(self, armed: Sequence[ArmedHang]) -> None:
        self.armed = list(armed)
        self.exposure_s = 0.0   # wall seconds with at least one request running
        self.fired: ArmedHang | None = None

    def advance(self, dt: float, running: int) -> ArmedHang | None:
        """Account `dt` wall seconds with `running` requests; return the hang that fires, if any."""
        if dt <= 0 or self.fired is not None:
            return None
        if running >= 1:
            self.exposure_s += dt
        due: list[tuple[float, ArmedHang]] = []
        for a in self.armed:
            if running >= a.hang.min_running:
                before = a.remaining_s
                a.accrued_s += dt
                if a.remaining_s <= 0:
                    due.append((before, a))
        if due:
            due.sort(key=lambda pair: pair[0])
            self.fired = due[0][1]
        return self.fired

    def next_deadline(self, running: int) -> float | None:
        """Wall seconds until the next hang could fire at this load (None: none can)."""
        rem = [a.remaining_s for a in self.armed if running >= a.hang.min_running]
        return max(0.0, min(rem)) if rem else None
