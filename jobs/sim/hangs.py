"""When the simulated engine hangs: exponential time to hang, accrued only under enough load.

Arming is shared with the fault plugin (`jobs/hang_arming.py`): each hang of the hang model whose
`when` matches the engine's (default-filled) flags and GPU gets its own time to hang, drawn once with
mean `Hang.effective_mttf_s(flags)` divided by the time scale, from an RNG seeded by the hang
model's `seed`, the engine's `--seed`, the hang's id and the engine's flags and GPU type, so one
command line always hangs at the same point of its load, and the cells of a matrix run, which share
a `--seed`, each draw their own. What is the simulator's own is the clock: a hang's runs only while
at least its `min_running` requests are running, and the first hang whose clock passes its draw fires.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from soakmatrix.jobs import hang_arming
from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel

RNG_NAMESPACE = "soakmatrix-sim-hang"


def engine_identity(full_flags: Mapping[str, object], gpu: str | None) -> str:
    """What tells one engine from another beside its seed: its resolved flags and its GPU type."""
    return json.dumps({"flags": dict(sorted(full_flags.items())), "gpu": gpu or None}, sort_keys=True, default=str)


def draw_time_to_hang(
    hang: Hang, flags: Mapping[str, object], model_seed: int, seed: int, time_scale: float = 1.0, gpu: str | None = None
) -> float:
    """Wall seconds of qualifying load before `hang` fires (exponential, mean MTTF / time_scale)."""
    full = flagmod.resolve_defaults(flags)
    return hang_arming.draw_exposure(
        RNG_NAMESPACE, model_seed, seed, hang.id, hang.effective_mttf_s(full), time_scale, engine_identity(full, gpu)
    )


@dataclass
class ArmedHang(hang_arming.Arming):
    """An armed hang (`mttf_s` in engine seconds, `fires_after_s` in scaled wall seconds) and its clock."""

    accrued_s: float = 0.0

    @property
    def remaining_s(self) -> float:
        return self.fires_after_s - self.accrued_s


def arm(
    model: HangModel,
    flags: Mapping[str, object],
    gpu: str | None,
    seed: int,
    time_scale: float = 1.0,
    build: tuple[int, str] | None = None,
) -> list[ArmedHang]:
    """The hangs this engine carries; `build` (ordinal, name) for hang models keyed on the build."""
    full = flagmod.resolve_defaults(flags)
    return [
        ArmedHang(a.hang, a.mttf_s, a.fires_after_s)
        for a in hang_arming.arm(
            model,
            full,
            gpu,
            seed,
            RNG_NAMESPACE,
            time_scale=time_scale,
            build=build,
            identity=engine_identity(full, gpu),
        )
    ]


class HangClock:
    """Accrues load time per armed hang and says which fires first."""

    def __init__(self, armed: Sequence[ArmedHang]) -> None:
        self.armed = list(armed)
        self.exposure_s = 0.0  # wall seconds with at least one request running
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
