"""Bisection cost and correctness in virtual time.

Planted conjunctions of k of n boolean flags (n in 6, 10, 12; k in 1, 2, 3; at random positions
among the n, drawn per seed) at MTTF 10 min, 38 min
or 2 h, with and without an x8 modifier (a further flag of the failing cell that makes the hang 8x
more frequent: without it MTTF is 8x longer, still a hang), and an OR of two conjunctions. Every
probe pays a 10-minute start-up; TP = 1, so GPU-hours are hours of (start-up + load).

Compared with: one-at-a-time ablation (drop each flag, one fixed 2 h soak, stop at the first
hang); ddmin (Zeller 2002) with one fixed 2 h soak per test; the information bound
ceil(log2 C(n,k)) probes, cost-weighted: each bit costs a start-up plus the mean of a positive
probe (about one MTTF) and a negative one at the stated confidence (MTTF x ln(1/alpha)); and the
lower bound (`matrix/bisect/bound.py`): the least mean GPU-hours of any procedure that returns
exactly the planted set with the stated probability at every MTTF (the search itself, calibration
and the checks for modifiers and second triggers left out, so a true floor), for the old question
(is each flag needed to hang at all) and for the one the default settings answer
(`benchmarks/bound_default.py`: no hang without a necessary flag up to an x8 slowdown, and
modifier verdicts that call an x8 modifier with the stated probability). The `mod` column is how
often the row's x8 modifier was called one, `spur` how often another flag outside the set was.

    python -m benchmarks.bench_bisect            # 1000 seeds per case (minutes on 2 cores)
    python -m benchmarks.bench_bisect --quick    # 100 seeds per case
    python -m benchmarks.bench_bisect --shapes   # the seeds' own shapes (bench_bisect_shapes.py)
    python -m benchmarks.bench_bisect --quick --filter "n=12 k=1" --breakdown   # where the GPU-hours go
    python -m benchmarks.bench_bisect --seeds 300 --filter "n=10 k=2 MTTF 38m" --parallel 1,2,4   # wall time
    python -m benchmarks.bench_bisect --seeds 300 --filter "10m \\+x8" --told-modifier   # finding the modifier free
    python -m benchmarks.bench_bisect --seeds 300 --filter "10m" --told-modifier --holm-least 1   # and Holm's rule-outs

With `--parallel`, each case runs at each width and the table gives GPU-hours and hours of wall
time: a batch's probes soak side by side, so a round lasts as long as its longest probe.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

STARTUP_S = 600.0
FIXED_SOAK_S = 7200.0
CONFIDENCE = 0.99


@dataclass(frozen=True)
class Case:
    n: int
    k: int
    mttf_s: float
    modifier: bool = False
    either: bool = False        # an OR of two conjunctions of k flags each

    @property
    def name(self) -> str:
        m = f"{self.mttf_s / 60:.0f}m" if self.mttf_s < 3600 else f"{self.mttf_s / 3600:.0f}h"
        kind = "OR of 2x" if self.either else ""
        return f"n={self.n:<2} k={kind}{self.k} MTTF {m:<3}{' +x8 mod' if self.modifier else ''}"

    def triggers(self) -> list[frozenset[int]]:
        first = frozenset(range(self.k))
        if self.either:
            return [first, frozenset(range(self.k, 2 * self.k))]
        return [first]

    def answers(self, cap_s: float | None = None) -> list[set[int]]:
        """The true minimal sets. By default (no cap given) the x8 modifier is never part of the set:
        the hang was seen without it. Under an explicit cap it is, when 8 x the MTTF is
        beyond that cap."""
        if self.modifier and cap_s is not None and 8.0 * self.mttf_s > cap_s:
            return [set(self.triggers()[0]) | {self.modifier_flag}]
        return [set(t) for t in self.triggers()]

    @property
    def modifier_flag(self) -> int | None:
        return self.k if self.modifier else None

    def rate(self, on: frozenset[int]) -> float:
        """Hang rate (1/s) of baseline + the flags in `on`: the failing cell's is 1/MTTF."""
        if not any(t <= on for t in self.triggers()):
            return 0.0
        if self.modifier and self.modifier_flag not in on:
            return 1.0 / (8.0 * self.mttf_s)
        return 1.0 / self.mttf_s


def cases() -> list[Case]:
    out = [Case(n, k, m, mod) for mod in (False, True) for n in (6, 10, 12) for k in (1, 2, 3)
           for m in (600.0, 2280.0, 7200.0)]
    out += [Case(10, 2, 2280.0, either=True), Case(12, 1, 600.0, either=True)]
    return out


def lower_bound(case: Case) -> float:
    """The least mean GPU-hours any bisection right with probability CONFIDENCE can spend on the old
    question (is each flag of the set needed to hang at all; `matrix/bisect/bound.py`): plain
    conjunction of k; with a modifier or a second trigger the true cost is only higher."""
    from soakmatrix.matrix.bisect.bound import lower_bound as bound
    return bound(case.n, case.k, case.mttf_s, STARTUP_S, CONFIDENCE).gpu_hours


def default_floor(case: Case) -> float:
    """The same for the question the default settings answer (`benchmarks/bound_default.py`):
    each necessary flag's absence soaked until an x rule_out_factor slowdown is ruled out, and the
    modifier verdicts (with the row's x8 modifier called one with probability CONFIDENCE)."""
    from soakmatrix.matrix.bisect import Settings
    from benchmarks.bound_default import default_floor as floor
    return floor(case.n, case.k, case.mttf_s, STARTUP_S, CONFIDENCE, Settings().rule_out_factor,
                 modifier=case.modifier).gpu_hours


def information_bound(case: Case) -> tuple[int, float]:
    probes = math.ceil(math.log2(math.comb(case.n, case.k)))
    per_probe = STARTUP_S + case.mttf_s * (1.0 + math.log(1.0 / (1.0 - CONFIDENCE))) / 2.0
    return probes, probes * per_probe / 3600.0


# -- the algorithm under test -----------------------------------------------------------------------

class _CaseOracle:
    """The virtual oracle for a Case: exponential hang times, first hang ends the probe."""

    def __init__(self, case: Case, names: list[str], rng: np.random.Generator):
        self.case, self.names, self.rng = case, names, rng
        self.wall_s = 0.0      # the batches one after another, each as long as its longest probe
        self.rounds = 0

    def run(self, probes):
        from soakmatrix.matrix.bisect.oracle import ProbeResult
        out = []
        for p in probes:
            on = frozenset(i for i, name in enumerate(self.names) if p.flags[name])
            rate = self.case.rate(on)
            t = self.rng.exponential(1.0 / rate) if rate > 0 else math.inf
            hung = t < p.soak_s
            exposure = t if hung else p.soak_s
            out.append(ProbeResult(p, "hang" if hung else "passed", "shm_broadcast_timeout" if hung else None,
                                   exposure, (STARTUP_S + exposure) / 3600.0))
        self.wall_s += STARTUP_S + max((r.exposure_s for r in out), default=0.0)
        self.rounds += 1
        return out


KINDS = ("the failing cell", "without a culprit", "other configs without a culprit", "without one innocent flag",
         "without the modifier", "without a group of innocent flags", "without a group with the modifier",
         "the set alone", "the set plus the modifier")


def config_kind(case: Case, on: frozenset[int]) -> str:
    """Which of KINDS a config (its planted flags that are on) is, for --breakdown."""
    truth, mod = set(case.triggers()[0]), case.modifier_flag
    off = set(range(case.n)) - on
    if not off:
        return KINDS[0]
    if off & truth:
        return KINDS[1] if len(off) == 1 else KINDS[2]
    if off == {mod}:
        return KINDS[4]
    if len(off) == 1:
        return KINDS[3]
    if set(on) == truth:
        return KINDS[7]
    if mod is not None and set(on) == truth | {mod}:
        return KINDS[8]
    return KINDS[6] if mod in off else KINDS[5]


# -- the diagnostics: the bisection's own functions swapped for one run ------------------------------

@contextlib.contextmanager
def diagnostics(told: str | None, holm_least: int) -> Iterator[None]:
    """--told-modifier (`told`: the planted modifier's name) and --holm-least (K > 0) for the runs
    inside: the modifier verdicts' search is told which flag is the modifier (what its verdicts cost
    once the flag is known), and the necessity rule-outs step down (Holm) to alpha / K at the
    loosest. Swapped in this process only (a worker's), and back on the way out."""
    from soakmatrix.matrix.bisect import ablation, modifiers
    saved = modifiers._likeliest, ablation._rule_out_level
    if told is not None:
        modifiers._likeliest = lambda search, minimal_mask, group, target: _told(search, group, told)
    if holm_least:
        ablation._rule_out_level = functools.partial(holm_level, least=holm_least)
    try:
        yield
    finally:
        modifiers._likeliest, ablation._rule_out_level = saved


def _told(search, group: list[int], name: str) -> int | None:
    """The told modifier, if in `group`."""
    j = next((i for i, e in enumerate(search.elements) if e.name == name), None)
    return j if j in group else None


def holm_level(p_no_hang: dict[int, float], keep: int, dropped: int, alpha: float, least: int) -> float:
    """The rule-outs' level stepping down (Holm) from alpha / k as kept flags are called, to
    alpha / `least` at the loosest. What the floor allows, but it cost seed 002 its 0.95 (0.947 at
    K = 2, 0.921 at K = 1): why the bisection keeps alpha / k for each (ablation._rule_out_level)."""
    kept = bin(keep & ~dropped).count("1")
    least = min(least, kept)
    called = 0
    for j in sorted(p_no_hang, key=lambda j: p_no_hang[j]):
        if p_no_hang[j] > alpha / max(kept - called, least, 1):
            break
        called += 1
    return alpha / max(kept - called, least, 1)


def _run_bisect(args: tuple[Case, list[int], bool, int, bool, int | None]) -> list[tuple[float, int, int, int, int, int, dict, float, int]]:
    from soakmatrix.matrix.bisect import Element, Settings, bisect_flags
    case, seeds, fixed_positions, width, told, holm_least = args
    names = [f"f{i}" for i in range(case.n)]
    failing = {name: True for name in names}
    elements = [Element(name, True, False) for name in names]
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        # planted flag j is element planted[j]: at random positions, as a user's flags would be
        # (the search breaks ties by position, so fixed positions flatter or punish it)
        planted = names if fixed_positions else [names[i] for i in rng.permutation(case.n)]
        oracle = _CaseOracle(case, planted, rng)
        told_name = planted[case.modifier_flag] if told and case.modifier else None
        with diagnostics(told_name, holm_least or 0):
            r = bisect_flags(failing, elements, oracle, Settings(confidence=CONFIDENCE, startup_s=STARTUP_S,
                                                                 max_probes=400, parallel=width))
        got = {planted.index(x) for x in r.minimal}
        truths = case.answers(None)
        exact = r.status == "found" and got in truths
        false_min = r.status == "found" and got not in truths
        modifiers = {planted.index(v.element.name) for v in r.verdicts if v.kind == "modifier"}
        # the planted modifier called one; any other flag outside the set called one (spurious)
        hit = int(case.modifier_flag in modifiers)
        spurious = int(bool(modifiers - {case.modifier_flag} - set().union(*truths)))
        # where the GPU-hours went (--breakdown): probes, hangs, load in MTTFs, GPU-hours by config kind
        kinds: dict[str, list[float]] = {}
        for res in r.log:
            row = kinds.setdefault(config_kind(case, frozenset(planted.index(f) for f, v in res.probe.flags.items()
                                                               if v and f in planted)), [0.0, 0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += res.hung_with(r.signature)
            row[2] += res.exposure_s / case.mttf_s
            row[3] += res.gpu_hours
        kinds.update({f"role: {k}": [0.0, 0.0, 0.0, v] for k, v in r.gpu_hours_by_role.items()})
        out.append((r.gpu_hours, int(exact), int(false_min), r.probes, hit, spurious, kinds, oracle.wall_s / 3600.0,
                    oracle.rounds))
    return out


# -- baselines ----------------------------------------------------------------------------------------

def _soak(case: Case, on: frozenset[int], rng: np.random.Generator) -> tuple[bool, float]:
    rate = case.rate(on)
    t = rng.exponential(1.0 / rate) if rate > 0 else math.inf
    return (True, t) if t < FIXED_SOAK_S else (False, FIXED_SOAK_S)


def one_at_a_time(case: Case, seeds: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(12345)
    full = frozenset(range(case.n))
    cost, exact = np.zeros(seeds), np.zeros(seeds, dtype=bool)
    truths = case.answers()
    for s in range(seeds):
        kept = set()
        for e in range(case.n):
            hung, t = _soak(case, full - {e}, rng)
            cost[s] += (STARTUP_S + t) / 3600.0
            if not hung:
                kept.add(e)
        exact[s] = kept in truths
    return cost, exact


def ddmin(case: Case, seeds: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(54321)
    truths = case.answers()
    cost, exact = np.zeros(seeds), np.zeros(seeds, dtype=bool)
    for s in range(seeds):
        cache: dict[frozenset[int], bool] = {}
        spent = [0.0]

        def test(c: frozenset[int]) -> bool:
            if c not in cache:
                hung, t = _soak(case, c, rng)
                spent[0] += (STARTUP_S + t) / 3600.0
                cache[c] = hung
            return cache[c]

        # the planted flags sit at random positions (ddmin's cost depends on where they are)
        current = [int(x) for x in rng.permutation(case.n)]
        granularity = 2
        while len(current) >= 2:
            chunks = [current[i * len(current) // granularity:(i + 1) * len(current) // granularity]
                      for i in range(granularity)]
            reduced = False
            for chunk in chunks:
                if test(frozenset(chunk)):
                    current, granularity, reduced = chunk, 2, True
                    break
            if not reduced:
                for chunk in chunks:
                    complement = [x for x in current if x not in chunk]
                    if test(frozenset(complement)):
                        current, granularity, reduced = complement, max(granularity - 1, 2), True
                        break
            if not reduced:
                if granularity >= len(current):
                    break
                granularity = min(len(current), 2 * granularity)
        cost[s] = spent[0]
        exact[s] = set(current) in truths
    return cost, exact


# -- main -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 seeds per case")
    parser.add_argument("--seeds", type=int, help="seeds per case (default 1000, --quick 100)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--filter", default="", help="only cases whose name matches this regular expression")
    parser.add_argument("--fixed-positions", action="store_true",
                        help="plant the flags at the first positions (f0, f1, ...) instead of random ones")
    parser.add_argument("--breakdown", action="store_true",
                        help="after each row, where its GPU-hours went: probes, hangs, load (MTTFs) and GPU-hours per "
                             "run by config kind, and GPU-hours by role")
    parser.add_argument("--parallel", metavar="K,K,...",
                        help="each case at these widths (--parallel K): GPU-hours and hours of wall time")
    parser.add_argument("--told-modifier", action="store_true",
                        help="a diagnostic: the modifier verdicts' search is told which flag is the planted x8 modifier "
                             "(what the rows would cost if finding it were free)")
    parser.add_argument("--holm-least", type=int, metavar="K",
                        help="a diagnostic: the necessity rule-outs step down (Holm) to alpha / K at the loosest "
                             "(0 is alpha / k for each kept flag, as by default)")
    parser.add_argument("--shapes", action="store_true",
                        help="the seeds' own shapes at the default settings (benchmarks/bench_bisect_shapes.py)")
    args = parser.parse_args(argv)
    if args.holm_least is not None and args.holm_least < 0:
        parser.error(f"--holm-least: 0 or more, not {args.holm_least}")
    seeds = args.seeds or (100 if args.quick else 1000)
    if args.shapes:
        from benchmarks.bench_bisect_shapes import run_shapes
        run_shapes(seeds, args.workers, args.filter)
        return 0
    todo = [c for c in cases() if re.search(args.filter, c.name)]
    if args.parallel:
        try:
            widths = [int(w) for w in args.parallel.split(",")]
        except ValueError:
            parser.error(f"--parallel: widths separated by commas, not {args.parallel!r}")
        if not widths or min(widths) < 1:
            parser.error(f"--parallel: widths of 1 or more, not {args.parallel!r}")
        return _parallel_table(todo, widths, seeds, args)
    print(f"bisect benchmark: {seeds} seeds per case, planted flags at "
          f"{'the first' if args.fixed_positions else 'random'} positions, start-up {STARTUP_S / 60:.0f} min per probe, "
          f"TP 1, stated confidence {CONFIDENCE}; GPU-hours mean/p90; exact = returned exactly a true minimal "
          f"set; false-min = returned a wrong set as minimal; floor = the old question's (bound.py), default = "
          f"the default question's (bound_default.py), x = bisect's mean over it; mod = the planted x8 "
          f"modifier called one, spur = another flag called one"
          f"{'; TOLD WHICH FLAG IS THE MODIFIER (--told-modifier, a diagnostic)' if args.told_modifier else ''}"
          f"{f'; RULE-OUTS STEP DOWN TO ALPHA / {args.holm_least} (--holm-least, a diagnostic)' if args.holm_least else ''}",
          flush=True)
    header = (f"{'case':<28} {'bisect mean':>11} {'p90':>6} {'exact':>6} {'false':>6} {'probes':>6} | "
              f"{'bound':>5} {'x':>5} | {'floor':>5} {'x':>4} | {'default':>7} {'x':>4} {'mod':>5} {'spur':>5} | "
              f"{'1-at-a-time':>11} {'exact':>6} | {'ddmin':>6} {'exact':>6}")
    print(header)
    print("-" * len(header), flush=True)
    start = time.time()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for case in todo:
            rows = _rows(pool, case, seeds, args)
            gh = np.array([r[0] for r in rows])
            exact = np.mean([r[1] for r in rows])
            false_min = np.mean([r[2] for r in rows])
            probes = np.mean([r[3] for r in rows])
            _, bound_h = information_bound(case)
            floor_h = None if case.either else lower_bound(case)   # derived for one conjunction only
            floor = f"{'-':>5} {'-':>4}" if floor_h is None else f"{floor_h:>5.1f} {gh.mean() / floor_h:>4.2f}"
            default_h = None if case.either else default_floor(case)
            default = (f"{'-':>7} {'-':>4}" if default_h is None
                       else f"{default_h:>7.1f} {gh.mean() / default_h:>4.2f}")
            hit = f"{np.mean([r[4] for r in rows]):>5.3f}" if case.modifier else f"{'-':>5}"
            spurious = f"{np.mean([r[5] for r in rows]):>5.3f}"
            oat_cost, oat_exact = one_at_a_time(case, seeds)
            dd_cost, dd_exact = ddmin(case, seeds)
            print(f"{case.name:<28} {gh.mean():>11.2f} {np.percentile(gh, 90):>6.1f} {exact:>6.3f} {false_min:>6.3f} "
                  f"{probes:>6.1f} | {bound_h:>5.1f} {gh.mean() / bound_h:>5.2f} | {floor} | "
                  f"{default} {hit} {spurious} | "
                  f"{oat_cost.mean():>11.2f} "
                  f"{oat_exact.mean():>6.3f} | {dd_cost.mean():>6.2f} {dd_exact.mean():>6.3f}", flush=True)
            if args.breakdown:
                _print_breakdown([r[6] for r in rows])
    print(f"({time.time() - start:.0f} s)")
    return 0


def _rows(pool: ProcessPoolExecutor, case: Case, seeds: int, args: argparse.Namespace, width: int = 1) -> list[tuple]:
    """`_run_bisect`'s rows for seeds 0..seeds-1 of `case`, in chunks over the pool's workers."""
    chunks = np.array_split(np.arange(seeds), args.workers * 4)
    return [row for part in pool.map(_run_bisect, [(case, [int(s) for s in c], args.fixed_positions, width,
                                                    args.told_modifier, args.holm_least)
                                                   for c in chunks if len(c)])
            for row in part]


def _parallel_table(todo: list[Case], widths: list[int], seeds: int, args: argparse.Namespace) -> int:
    """Each case at each --parallel width: GPU-hours, wall hours, probes, exact, mod, spur."""
    print(f"bisect with --parallel: {seeds} seeds per case and width, start-up {STARTUP_S / 60:.0f} min, TP 1, "
          f"confidence {CONFIDENCE}; wall = the rounds one after another, each as long as its longest probe", flush=True)
    header = (f"{'case':<28} {'width':>5} {'GPU-h':>7} {'wall h':>7} {'(p90)':>6} {'probes':>6} {'rounds':>6} "
              f"{'exact':>6} {'mod':>5} {'spur':>5}")
    print(header)
    print("-" * len(header), flush=True)
    start = time.time()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for case in todo:
            for width in widths:
                rows = _rows(pool, case, seeds, args, width)
                gh = np.array([r[0] for r in rows])
                wall = np.array([r[7] for r in rows])
                rounds = np.mean([r[8] for r in rows])
                hit = f"{np.mean([r[4] for r in rows]):>5.3f}" if case.modifier else f"{'-':>5}"
                print(f"{case.name:<28} {width:>5} {gh.mean():>7.2f} {wall.mean():>7.2f} {np.percentile(wall, 90):>6.1f} "
                      f"{np.mean([r[3] for r in rows]):>6.1f} {rounds:>6.1f} {np.mean([r[1] for r in rows]):>6.3f} "
                      f"{hit} {np.mean([r[5] for r in rows]):>5.3f}", flush=True)
    print(f"({time.time() - start:.0f} s)")
    return 0


def _print_breakdown(runs: list[dict[str, list[float]]]) -> None:
    total: dict[str, np.ndarray] = {}
    for kinds in runs:
        for k, v in kinds.items():
            total[k] = total.get(k, np.zeros(4)) + np.array(v)
    print(f"    {'per run, by config':<36} {'probes':>6} {'hangs':>6} {'MTTFs':>6} {'GPU-h':>6}")
    for k in [k for k in KINDS if k in total]:
        v = total[k] / len(runs)
        print(f"    {k:<36} {v[0]:>6.2f} {v[1]:>6.2f} {v[2]:>6.2f} {v[3]:>6.2f}")
    roles = sorted((k for k in total if k.startswith("role: ")), key=lambda k: -total[k][3])
    print("    GPU-hours by role: " + ", ".join(f"{k[6:]} {total[k][3] / len(runs):.2f}" for k in roles), flush=True)


if __name__ == "__main__":
    sys.exit(main())
