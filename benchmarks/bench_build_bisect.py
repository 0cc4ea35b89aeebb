"""Build bisection cost and correctness in virtual time.

A planted change point among n ordered builds (n in 8, 32, 128, 512; the first bad build uniform
over 1..n-1, drawn per seed): builds from it on hang with the target signature at MTTF 10 min,
38 min or 2 h, builds before it never do; with and without an unrelated flaky hang of another
signature on every build (MTTF 3 h), which ends a probe early. Every probe pays 10 minutes of
install and start-up; one GPU, so GPU-hours are hours of (start-up + load).

Compared with: plain bisection with one 2 h soak per build (a target hang = bad, else good; another
signature's hang restarts the soak for what is left of the 2 h); the same with up to 3 soaks of 2 h
per build; a FACF-style search (Henderson et al., ICST 2023: a Bayesian noisy binary search over
the change point, one fixed 2 h run per probe read as pass/fail, the chance a bad build fails a run
estimated from the runs on builds known bad, the next probe the build that splits the posterior mass closest to half, stop at the
stated confidence); and the floor (`matrix/build_bisect/bound.py`): the least mean GPU-hours of
any procedure that names exactly the first bad build with the stated probability. `--where` splits
each case's GPU-hours (load on the bad and good builds, start-ups) against the floor's own split.

    python -m benchmarks.bench_build_bisect                # 200 seeds per case (minutes on 2 cores)
    python -m benchmarks.bench_build_bisect --seeds 1000   # the full run
    python -m benchmarks.bench_build_bisect --parallel 4   # rounds of 4 probes at once: wall time
    python -m benchmarks.bench_build_bisect --setting error_share=0.7   # an ablation of a BuildSettings field
    python -m benchmarks.bench_build_bisect --tuning stall_probes=60    # ... or of a Tuning field

Two more shapes users meet every week, in rows of their own (16-512 builds, MTTF 10 min to 8 h):
"+other": another signature hangs on every build at the target's own MTTF, and no signature is named
(the first hang is the unrelated one half the time): right = the target named exactly, as the
headline; "x4" / "x16": a rate change, the builds before the change point hang with the target too,
at 4 / 16 times its MTTF: right = its build named exactly (as a rate change, or as the first bad
build when no old hang was seen). The +other rows print the floor of the named problem with that
background (the unnamed one is harder); the rate-change rows the floor of bound_rate.py.

`--parallel K` runs the algorithm with rounds of up to K probes soaked side by side and reports,
beside GPU-hours and exactness, the rounds and the wall time (each round lasts as long as its
longest probe, start-up included) against one probe at a time.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

STARTUP_S = 600.0
FIXED_SOAK_S = 7200.0
BACKGROUND_MTTF_S = 3 * 3600.0
CONFIDENCE = 0.99
SIGNATURE = "shm_broadcast_timeout"


@dataclass(frozen=True)
class Case:
    n: int
    mttf_s: float
    background: bool = False
    untestable: float = 0.0
    other: bool = False          # another signature on every build at the target's MTTF; none named
    old_ratio: float = 0.0       # a rate change: builds before the change point at old_ratio x the MTTF

    @property
    def name(self) -> str:
        m = f"{self.mttf_s / 60:.0f}m" if self.mttf_s < 3600 else f"{self.mttf_s / 3600:.0f}h"
        extra = (" +flaky" if self.background else "") + (f" {self.untestable:.0%} untestable" if self.untestable else "")
        extra += (" +other" if self.other else "") + (f" x{self.old_ratio:.0f}" if self.old_ratio else "")
        return f"n={self.n:<3} MTTF {m:<3}{extra}"


def cases(untestable: float = 0.0) -> list[Case]:
    out = [Case(n, m, bg) for bg in (False, True) for n in (8, 32, 128, 512) for m in (600.0, 2280.0, 7200.0)]
    if untestable:
        out += [Case(n, 2280.0, False, untestable) for n in (32, 128)]
    out += [Case(n, m, other=True) for n, m in ((16, 600.0), (32, 2280.0), (128, 7200.0), (512, 2280.0), (16, 28800.0))]
    out += [Case(n, m, old_ratio=k) for k in (4.0, 16.0) for n, m in ((16, 1800.0), (128, 1800.0), (512, 600.0), (16, 28800.0))]
    return out


def change_point(case: Case, seed: int) -> int:
    return int(np.random.default_rng(seed).integers(1, case.n))


def oracle(case: Case, seed: int):
    from soakmatrix.matrix.build_bisect import VirtualBuildOracle
    background = BACKGROUND_MTTF_S if case.background else case.mttf_s if case.other else None
    return VirtualBuildOracle(case.n, change_point(case, seed), case.mttf_s, startup_s=STARTUP_S, seed=seed + 7_000_000,
                              background_mttf_s=background, untestable_fraction=case.untestable,
                              old_mttf_s=case.old_ratio * case.mttf_s if case.old_ratio else None)


# -- the algorithm under test -----------------------------------------------------------------------

def _run_ours(args: tuple[Case, list[int], int, dict]) -> list[tuple[float, int, int]]:
    from soakmatrix.matrix.build_bisect import FOUND, RANGE, RATE_CHANGE, BuildSettings, bisect_builds
    case, seeds, width, overrides = args
    out = []
    for seed in seeds:
        cp = change_point(case, seed)
        o = oracle(case, seed)
        timed = _Timed(o)
        r = bisect_builds([f"b{i}" for i in range(case.n)], timed,
                          BuildSettings(**{"confidence": CONFIDENCE, "startup_s": STARTUP_S,
                                           "signature": None if case.other else SIGNATURE, "parallel": width,
                                           **overrides}))
        # a rate change's build named as a clean regression (no old hang seen, the build below bounded
        # from its passes) is the right build too
        expected = (FOUND, RATE_CHANGE) if case.old_ratio else (FOUND,)
        exact = r.signature == SIGNATURE and ((r.status in expected and r.first_bad == cp) or (
            r.status == RANGE and r.range[0] <= cp <= r.range[1] and all(i in o.untestable for i in range(r.range[0], cp))))
        out.append((r.gpu_hours, int(exact), r.probes, _where(r, cp, case), r.rounds, timed.wall_s / 3600.0))
    return out


class _Timed:
    """The oracle, with the wall time of its rounds: each as long as its longest probe (one GPU each)."""

    def __init__(self, inner):
        self.inner, self.wall_s = inner, 0.0

    def run(self, probes):
        results = self.inner.run(probes)
        self.wall_s += max((r.gpu_hours * 3600.0 for r in results), default=0.0)
        return results


def _where(r, cp: int, case: Case) -> tuple[float, ...]:
    """Where one run's GPU-hours went, in MTTFs: load on the bad build the calibration soaks (the
    last, search probes of it included), on the other bad builds, on the last good build, on the
    good builds below it, and every probe's start-up."""
    load = [b.exposure_s / case.mttf_s for b in r.evidence]
    starts = sum(b.probes for b in r.evidence) * STARTUP_S / case.mttf_s
    return (load[-1], sum(load[cp:-1]), load[cp - 1], sum(load[:cp - 1]), starts)


# -- baselines ----------------------------------------------------------------------------------------

def _soak(case: Case, build: int, cp: int, soak_s: float, rng: np.random.Generator) -> tuple[bool, float, int]:
    """Soak `build` for `soak_s` of load, restarting after other signatures' hangs: (target hang,
    load, start-ups)."""
    load, starts = 0.0, 0
    while load < soak_s:
        starts += 1
        left = soak_s - load
        target = rng.exponential(case.mttf_s) if build >= cp else math.inf
        other = rng.exponential(BACKGROUND_MTTF_S) if case.background else math.inf
        if target < min(other, left):
            return True, load + target, starts
        if other < left:
            load += other
            continue
        load = soak_s
    return False, load, starts


def _plain(args: tuple[Case, list[int], int]) -> list[tuple[float, int]]:
    case, seeds, repeats = args
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed + 11_000_000)
        cp = change_point(case, seed)
        lo, hi, hours = 0, case.n - 1, 0.0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            bad = False
            for _ in range(repeats):
                hung, load, starts = _soak(case, mid, cp, FIXED_SOAK_S, rng)
                hours += (starts * STARTUP_S + load) / 3600.0
                if hung:
                    bad = True
                    break
            lo, hi = (lo, mid) if bad else (mid, hi)
        out.append((hours, int(hi == cp)))
    return out


def _facf(args: tuple[Case, list[int]]) -> list[tuple[float, int]]:
    """Flake Aware Culprit Finding, on the build axis: fixed 2 h runs read as pass/fail."""
    case, seeds = args
    n = case.n
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed + 13_000_000)
        cp = change_point(case, seed)
        hours, fails, runs = 0.0, 0, 0          # runs and fails on builds known bad
        passes = np.zeros(n)                    # passed runs per build
        lowest_bad = n - 1

        def run(build: int) -> bool:
            nonlocal hours
            hung, load, starts = _soak(case, build, cp, FIXED_SOAK_S, rng)
            hours += (starts * STARTUP_S + load) / 3600.0
            return hung

        while fails < 2 and runs < 50:          # calibration: the bad build to two failures
            runs += 1
            fails += run(n - 1)
        log_prior = np.log(np.full(n, 1.0 / n))
        for _ in range(500):
            p_fail = (fails + 1.0) / (runs + 2.0)
            # P(J = j): no failure below j; every pass on a build >= j is a missed failure
            missed = np.cumsum(passes[::-1])[::-1]
            logp = log_prior + missed * math.log(1.0 - p_fail)
            logp[lowest_bad + 1:] = -math.inf
            p = np.exp(logp - logp.max())
            p /= p.sum()
            if p.max() >= CONFIDENCE:
                break
            # the build whose result splits the mass closest to half: P(J <= i) nearest 0.5
            probe = int(np.argmin(np.abs(np.cumsum(p)[:-1] - 0.5)))
            if run(probe):
                lowest_bad = min(lowest_bad, probe)
                runs, fails = runs + 1, fails + 1
            else:
                passes[probe] += 1
                if probe >= lowest_bad:
                    runs += 1
        out.append((hours, int(int(np.argmax(p)) == cp)))
    return out


def floor(case: Case) -> float:
    from soakmatrix.matrix.build_bisect.bound import lower_bound
    from soakmatrix.matrix.build_bisect.bound_rate import rate_change_bound
    if case.old_ratio:
        return rate_change_bound(case.n, case.mttf_s, case.old_ratio, STARTUP_S, CONFIDENCE).gpu_hours
    return lower_bound(case.n, case.mttf_s, STARTUP_S, CONFIDENCE, background_mttf_s=_background(case)).gpu_hours


def _background(case: Case) -> float | None:
    """The flaky hang's MTTF in "+flaky" rows: the floor of that problem counts the probes it ends."""
    return BACKGROUND_MTTF_S if case.background else case.mttf_s if case.other else None


def _where_line(case: Case, mean: np.ndarray) -> str:
    from soakmatrix.matrix.build_bisect.bound import lower_bound
    to_mttfs = 3600.0 / case.mttf_s
    spent = (f"{'':<4}in MTTFs: last bad build {mean[0]:.1f}, other bad {mean[1]:.1f}, last good {mean[2]:.1f}, "
             f"good below {mean[3]:.1f}, start-ups {mean[4]:.1f}")
    if case.untestable:
        return spent     # no floor for that easier question (see the table)
    b = lower_bound(case.n, case.mttf_s, STARTUP_S, CONFIDENCE, background_mttf_s=_background(case))
    return (spent + f" | evidence floor {b.evidence_gpu_hours * to_mttfs:.1f} "
            f"(the neighbour's alone {b.neighbour_gpu_hours * to_mttfs:.1f}: bad {b.hang_mttfs:.1f}, last good "
            f"{b.refute_mttfs:.1f}, start-ups {b.probes * STARTUP_S / case.mttf_s:.1f}), "
            f"search floor {b.search_gpu_hours * to_mttfs:.1f} ({b.search_bits:.1f} bits at {b.bits_per_mttf:.2f}/MTTF)")


def settings_overrides(pairs: list[str]) -> dict:
    """`KEY=VALUE` pairs -> BuildSettings fields, each VALUE read as its field's default's type (an
    ablation of the planner's settings without editing them)."""
    from dataclasses import MISSING, fields

    from soakmatrix.matrix.build_bisect import BuildSettings

    # parallel is --parallel's (the table compares widths)
    known = {f.name: f.default for f in fields(BuildSettings) if f.default is not MISSING and f.name != "parallel"}
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise SystemExit(f"--setting {pair!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        kind = type(known[key])
        if known[key] is None:      # an optional field: a number when it reads as one (a budget), else text
            kind = float if re.fullmatch(r"[0-9.eE+-]+", value) else str
        try:
            out[key] = kind(value)
        except ValueError:
            raise SystemExit(f"--setting {pair!r}: {key} takes a {kind.__name__}") from None
    return out


def tuning_overrides(pairs: list[str]) -> dict:
    """`KEY=VALUE` pairs -> {"tuning": Tuning} with those fields changed (the rate-change model's and
    the unnamed search's constants, tuning.py), or {} when none is given."""
    from dataclasses import fields, replace

    from soakmatrix.matrix.build_bisect.tuning import Tuning

    base = Tuning()
    known = {f.name: type(getattr(base, f.name)) for f in fields(Tuning)}
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise SystemExit(f"--tuning {pair!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        try:
            out[key] = known[key](value)
        except ValueError:
            raise SystemExit(f"--tuning {pair!r}: {key} takes a {known[key].__name__}") from None
    return {"tuning": replace(base, **out)} if out else {}


# -- main -------------------------------------------------------------------------------------------

def _split(seeds: int, parts: int) -> list[list[int]]:
    return [[int(s) for s in c] for c in np.array_split(np.arange(seeds), parts) if len(c)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds per case (default 200; 1000 for the full run)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--filter", default="", help="only cases whose name matches this regular expression")
    parser.add_argument("--untestable", type=float, default=0.0,
                        help="also run n=32 and 128 at MTTF 38 min with this share of untestable builds")
    parser.add_argument("--no-baselines", action="store_true", help="only the algorithm and the floor")
    parser.add_argument("--parallel", type=int, default=0, metavar="K",
                        help="compare rounds of up to K probes at once with one at a time: rounds and wall time")
    parser.add_argument("--where", action="store_true",
                        help="also print where the GPU-hours go, in MTTFs per run, against the floor's own split")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a BuildSettings field for the algorithm (repeatable), e.g. error_share=0.7")
    parser.add_argument("--tuning", action="append", default=[], metavar="KEY=VALUE",
                        help="a Tuning field (tuning.py) for the algorithm (repeatable), e.g. stall_probes=60")
    args = parser.parse_args(argv)
    args.overrides = {**settings_overrides(args.setting), **tuning_overrides(args.tuning)}
    todo = [c for c in cases(args.untestable) if re.search(args.filter, c.name)]
    if args.parallel:
        return _parallel_table(todo, args)
    print(f"build bisection benchmark: {args.seeds} seeds per case, first bad build uniform over 1..n-1, "
          f"start-up + install {STARTUP_S / 60:.0f} min per probe, 1 GPU, stated confidence {CONFIDENCE}; "
          f"+flaky: every build also hangs with another signature at MTTF {BACKGROUND_MTTF_S / 3600:.0f} h; "
          f"GPU-hours mean/p90; exact = named exactly the first bad build"
          + (f"; settings {args.overrides}" if args.overrides else ""), flush=True)
    header = (f"{'case':<24} {'mean':>7} {'p90':>6} {'exact':>6} {'probes':>6} | {'floor':>5} {'x':>5} | "
              f"{'plain 1x2h':>10} {'exact':>6} | {'plain 3x2h':>10} {'exact':>6} | {'FACF':>7} {'exact':>6}")
    print(header)
    print("-" * len(header), flush=True)
    start = time.time()
    parts = args.workers * 4
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for case in todo:
            chunks = _split(args.seeds, parts)
            rows = [row for part in pool.map(_run_ours, [(case, c, 1, args.overrides) for c in chunks]) for row in part]
            gh = np.array([r[0] for r in rows])
            exact = np.mean([r[1] for r in rows])
            probes = np.mean([r[2] for r in rows])
            line = f"{case.name:<24} {gh.mean():>7.2f} {np.percentile(gh, 90):>6.1f} {exact:>6.3f} {probes:>6.1f} | "
            if case.untestable:
                # a range that holds the first bad build is a right answer there: an easier question,
                # which the plain floor does not bound
                line += f"{'-':>5} {'-':>5}"
            else:
                fl = floor(case)
                line += f"{fl:>5.1f} {gh.mean() / fl:>5.2f}"
            if not args.no_baselines and not case.untestable and not case.other and not case.old_ratio:
                for fn, extra in ((_plain, (1,)), (_plain, (3,)), (_facf, ())):
                    res = [row for part in pool.map(fn, [(case, c, *extra) for c in chunks]) for row in part]
                    width = 7 if fn is _facf else 10
                    line += f" | {np.mean([r[0] for r in res]):>{width}.2f} {np.mean([r[1] for r in res]):>6.3f}"
            print(line, flush=True)
            if args.where:
                print(_where_line(case, np.array([r[3] for r in rows]).mean(axis=0)), flush=True)
    print(f"({time.time() - start:.0f} s)")
    return 0


def _parallel_table(todo: list[Case], args: argparse.Namespace) -> int:
    widths = sorted({1, args.parallel})
    print(f"build bisection, rounds of up to K probes soaked at once: {args.seeds} seeds per case, start-up + install "
          f"{STARTUP_S / 60:.0f} min per probe, stated confidence {CONFIDENCE}; wall = sum over rounds of the longest "
          "probe", flush=True)
    header = f"{'case':<24} {'K':>2} {'GPU-h':>7} {'exact':>6} {'probes':>6} {'rounds':>6} {'wall h':>7} {'p90':>6}"
    print(header)
    print("-" * len(header), flush=True)
    start = time.time()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for case in todo:
            for width in widths:
                chunks = _split(args.seeds, args.workers * 4)
                rows = [row for part in pool.map(_run_ours, [(case, c, width, args.overrides) for c in chunks]) for row in part]
                wall = np.array([r[5] for r in rows])
                print(f"{case.name:<24} {width:>2} {np.mean([r[0] for r in rows]):>7.2f} "
                      f"{np.mean([r[1] for r in rows]):>6.3f} {np.mean([r[2] for r in rows]):>6.1f} "
                      f"{np.mean([r[4] for r in rows]):>6.1f} {wall.mean():>7.2f} {np.percentile(wall, 90):>6.1f}",
                      flush=True)
    print(f"({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
