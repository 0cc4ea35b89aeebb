"""Bisection on the seeds' own shapes, at the default settings (confidence 0.95,
no cap), in virtual time with a 10-minute start-up per probe and TP 1 unless the row says TP:

* seed 002: MTP + expert parallel needed (MTTF 38 min); autotune off makes it 8.2x slower
  (5 h 12 min); two irrelevant flags. Right = the set is exactly MTP + EP and autotune is called a
  modifier that slows the hang without it;
* a background crash: the failing cell also crashes every 10 minutes (another signature, from an
  irrelevant flag); the hang (one culprit among five, MTTF 38 min) must stay the target;
* irrelevant flags' modifier rate: two culprits among eight at MTTF 38 min: how often any of the
  six irrelevant flags is called a modifier (family-wise, so at most 1 - 0.95);
* value shrinking with TP: the hang needs MTP and TP >= 2, the failing cell runs TP 4: right = the
  minimal flags say tp=2.

    python -m benchmarks.bench_bisect --shapes [--seeds N] [--filter REGEX]
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

MTTF = 2280.0
STARTUP_S = 600.0
SHAPES = ("seed 002: MTP+EP, autotune x8.2", "background crash every 10m", "irrelevant flags (n=8, k=2)",
          "value shrinking, TP 4 -> 2")


def _bool_registry(n: int):
    from soakmatrix.matrix.contracts import flags as flagmod
    return {f"f{i}": flagmod.raw_flag(f"f{i}", "bool", ["--f{value}"], default=False) for i in range(n)}


def _one(shape: str, seed: int) -> tuple[bool, float, bool, bool]:
    """(right, GPU-hours, any modifier called on an irrelevant flag, inconclusive) for one run."""
    from soakmatrix.matrix.bisect import Element, Settings, bisect
    from soakmatrix.matrix.bisect.oracle_virtual import VirtualOracle
    from soakmatrix.matrix.contracts import flags as flagmod
    from soakmatrix.matrix.contracts.hangmodel import Hang, HangModel, Modifier

    def plain(n: int, trigger: list[str], extra=(), modifiers=()):
        model = HangModel(seed=1, hangs=(Hang("planted", "shm_broadcast", {f: (True,) for f in trigger}, MTTF,
                                              modifiers=tuple(modifiers)), *extra))
        oracle = VirtualOracle(model, seed=seed, startup_s=STARTUP_S, registry=_bool_registry(n),
                               gpu_count=lambda f: 1)
        return bisect({f"f{i}": True for i in range(n)}, [Element(f"f{i}", True, False) for i in range(n)], oracle,
                      Settings(startup_s=STARTUP_S), gpu_count=lambda f: 1)

    if shape.startswith("seed 002"):
        r = plain(5, ["f0", "f1"], modifiers=[Modifier({"f2": (False,)}, 312 / 38)])
        v = {x.element.name: x for x in r.verdicts}
        right = r.status == "found" and r.minimal == ["f0", "f1"] and v["f2"].kind == "modifier" and v["f2"].ratio > 1
        return right, r.gpu_hours, any(v[f].kind == "modifier" for f in ("f3", "f4")), r.status == "inconclusive"
    if shape.startswith("background"):
        r = plain(5, ["f1"], extra=[Hang("background", "crash", {"f4": (True,)}, 600.0)])
        right = r.status == "found" and r.signature == "shm_broadcast_timeout" and r.minimal == ["f1"]
        return right, r.gpu_hours, any(v.kind == "modifier" for v in r.verdicts), r.status == "inconclusive"
    if shape.startswith("irrelevant"):
        r = plain(8, ["f2", "f5"])
        return (r.status == "found" and sorted(r.minimal) == ["f2", "f5"], r.gpu_hours,
                any(v.kind == "modifier" for v in r.verdicts), r.status == "inconclusive")
    model = HangModel(seed=3, hangs=(Hang("tp-mtp", "shm_broadcast", {"mtp": (1, 2), "tp": (2, 4)}, MTTF),))
    oracle = VirtualOracle(model, registry=dict(flagmod.REGISTRY), seed=seed, startup_s=STARTUP_S)
    movable = [Element("mtp", 1, 0), Element("tp", 4, 1), Element("async_scheduling", True, False)]
    r = bisect({"mtp": 1, "tp": 4, "async_scheduling": True}, movable, oracle, Settings(startup_s=STARTUP_S),
               alternatives={"tp": [2]})
    right = r.status == "found" and sorted(r.minimal) == ["mtp", "tp"] and r.minimal_flags.get("tp") == 2
    return right, r.gpu_hours, any(v.kind == "modifier" for v in r.verdicts), r.status == "inconclusive"


def _chunk(args: tuple[str, list[int]]) -> list[tuple[bool, float, bool, bool]]:
    shape, seeds = args
    return [_one(shape, s) for s in seeds]


def run_shapes(seeds: int, workers: int, pattern: str = "") -> None:
    print(f"bisect on the seeds' shapes: {seeds} seeds per row, default settings (confidence 0.95, no cap), "
          f"start-up {STARTUP_S / 60:.0f} min per probe")
    header = f"{'shape':<34} {'right':>6} {'modifier called':>15} {'inconclusive':>12} {'GPU-h mean':>10} {'p90':>6}"
    print(header)
    print("-" * len(header), flush=True)
    start = time.time()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for shape in [s for s in SHAPES if re.search(pattern, s)]:
            chunks = np.array_split(np.arange(seeds), workers * 4)
            rows = [row for part in pool.map(_chunk, [(shape, [int(s) for s in c]) for c in chunks if len(c)])
                    for row in part]
            gh = np.array([r[1] for r in rows])
            right, called, unsure = (np.mean([r[i] for r in rows]) for i in (0, 2, 3))
            print(f"{shape:<34} {right:>6.3f} {called:>15.3f} {unsure:>12.3f} {gh.mean():>10.1f} "
                  f"{np.percentile(gh, 90):>6.1f}", flush=True)
    print(f"({time.time() - start:.0f} s)")
