"""The least GPU-hours any build bisection must spend, on average, to name a rate change's build.

The benchmark's rate-change rows: builds J..n-1 hang at rate 1 / M, builds before J at 1 / (k M)
(k >= 4: the change is at least `Tuning.min_ratio`). A procedure is right when it names J, and it
must be right with probability c whatever J, M and the old rate (as long as the ratio is at least
4, and also with no old rate: a clean regression). Loads below are in MTTFs after the change (M).
It is the larger of two floors, each valid alone, as in bound.py.

**The evidence floor** (Lemma 1 of Kaufmann, Cappe and Garivier, JMLR 2016, as bound.py's
neighbour floor). With V the expected load on build J and X on the builds below it:

* W'' (the change at J + 1): builds up to J hang at one rate b <= 1/4 (the ratio to the builds above
  at least 4), the builds above as in W. Per MTTF of load, build J gives d(1, b) and each build below
  d(1/k, b), with d(x, y) = x ln(x / y) - x + y the Poisson divergence per unit time. So
  V d(1, b) + X d(1/k, b) >= d(c, 1 - c) for every b <= 1/4.
* W' (the change at J - 1): build J - 1 and up hang at a >= 4/k, the builds below J - 1 as in W. With
  Y' the load on builds J and up and X1 on J - 1: Y' d(1, a) + X1 d(1/k, a) >= d(c, 1 - c) for every
  a >= 4/k. Load elsewhere buys nothing here that V and X do not, so at the least Y' = V, X1 = X:
  both are one constraint, min over r in R of V d(1, r) + X d(1/k, r) >= d(c, 1 - c), R = (0, 1/4]
  with [4/k, inf). The expression is convex in r with its minimum at the pooled rate
  r* = (V + X / k) / (V + X), so the minimum over R is at r* or at the ends 1/4 and 4/k (exact).
* Each hang ends a probe and each probe pays the start-up s: probes >= V + X / k.

It minimises V + X + (s / M)(V + X / k), on a grid whose cells are bounded by their worst corners
(the constraint at the cell's upper corner, the cost at its lower one), so it is a floor whatever
the grid.

**The search floor**: Fano's bits (bound.search_bits) over the most bits per MTTF a probe buys: a
probe tells about J only through "is build i at the new rate" (probability p), its outcome the hang
time cut at the soak's length L, at rate 1 or 1/k; its cost s / M + p (1 - e^-L) + (1 - p) k
(1 - e^(-L/k)). The information is integrated numerically, the best p and L found on a grid and
refined (as bound.search_rate).

**The spread floor** (bound_rate_spread.py): the error budget shared over the change points below the
answer, as bound.py's spread floor; the evidence floor is the larger of it and the neighbours'.

Left out, so a floor: the calibration, the alternatives with the old rate unknown or zero, the
change points further away, the overlap of search and evidence.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from soakmatrix.matrix.bisect.bound import binary_divergence

from .bound import search_bits


def divergence(x, y):
    """d(x, y) = x ln(x / y) - x + y: KL per unit time of a Poisson process at rate x from one at y."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(x / y), 0.0) - x + y


def least_divergence(v, x, k: float, min_ratio: float = 4.0):
    """min over r in (0, 1/min_ratio] u [min_ratio/k, inf) of v d(1, r) + x d(1/k, r), exactly."""
    v, x = np.asarray(v, dtype=float), np.asarray(x, dtype=float)
    lo, hi = 1.0 / min_ratio, min_ratio / k

    def phi(r):
        return v * divergence(1.0, r) + x * divergence(1.0 / k, r)

    with np.errstate(divide="ignore", invalid="ignore"):
        star = np.where(v + x > 0, (v + x / k) / np.maximum(v + x, 1e-300), 1.0)
    inside = (star <= lo) | (star >= hi)
    return np.where(inside, phi(np.where(inside, star, lo)), np.minimum(phi(lo), phi(hi)))


@dataclass(frozen=True)
class RateChangeBound:
    gpu_hours: float  # the larger of the two floors
    evidence_gpu_hours: float
    search_gpu_hours: float
    on_build_mttfs: float  # V: load on the change point's build at the evidence floor's optimum
    below_mttfs: float  # X: load on the builds below it
    bits_per_mttf: float
    spread_gpu_hours: float = 0.0  # the spread floor (bound_rate_spread.py), part of the evidence floor
    spread_rho: float = 1.0  # its refuting worlds' rate, a share of the rate after the change


_GRID = np.geomspace(1e-2, 400.0, 700)


def evidence_floor(k: float, sigma: float, confidence: float, min_ratio: float = 4.0) -> tuple[float, float, float]:
    """(floor in MTTFs, V, X): the least V + X + sigma (V + X / k) with the evidence constraint met."""
    need = binary_divergence(confidence, 1.0 - confidence)
    v_lo, v_hi = _GRID[:-1, None], _GRID[1:, None]
    x_lo, x_hi = _GRID[None, :-1], _GRID[None, 1:]
    ok = least_divergence(v_hi, x_hi, k, min_ratio) >= need  # the constraint rises in V and X
    cost = v_lo + x_lo + sigma * (v_lo + x_lo / k)
    cost = np.where(ok, cost, np.inf)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    return float(cost[i, j]), float(_GRID[i]), float(_GRID[j])


def probe_information(p: float, length: float, k: float, points: int = 2001) -> float:
    """I(B; min(T, length)) in bits: B the build at the new rate (probability p), T its hang time."""
    y = np.linspace(0.0, length, points)
    f1, f0 = np.exp(-y), np.exp(-y / k) / k
    mix = p * f1 + (1 - p) * f0
    with np.errstate(divide="ignore", invalid="ignore"):
        integrand = p * f1 * np.log(f1 / mix) + (1 - p) * f0 * np.log(f0 / mix)
    dens = float(np.trapezoid(integrand, y))
    q1, q0 = math.exp(-length), math.exp(-length / k)
    qm = p * q1 + (1 - p) * q0
    atom = sum(w * q * math.log(q / qm) for w, q in ((p, q1), (1 - p, q0)) if q > 0)
    return (dens + atom) / math.log(2)


def probe_cost(p: float, length: float, k: float, sigma: float) -> float:
    return sigma + p * -math.expm1(-length) + (1 - p) * k * -math.expm1(-length / k)


def search_rate(k: float, sigma: float) -> float:
    """The most bits per MTTF of start-up and load any probe buys (grid, then refined)."""
    best, arg = -math.inf, (0.5, 1.0)
    for p in np.linspace(0.05, 0.95, 19):
        for length in np.geomspace(0.05, 8 * k, 40):
            r = probe_information(p, length, k, 801) / probe_cost(p, length, k, sigma)
            if r > best:
                best, arg = r, (p, length)

    def neg(v):
        p, length = float(np.clip(v[0], 1e-4, 1 - 1e-4)), math.exp(v[1])
        return -probe_information(p, length, k) / probe_cost(p, length, k, sigma)

    local = minimize(neg, [arg[0], math.log(arg[1])], method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9})
    return max(best, -float(local.fun))


@functools.lru_cache(maxsize=64)
def rate_change_bound(
    n: int, mttf_s: float, ratio: float, startup_s: float, confidence: float, min_ratio: float = 4.0
) -> RateChangeBound:
    """The floor for naming a rate change of `ratio` among `n` builds, MTTF `mttf_s` after it."""
    if ratio < min_ratio:
        raise ValueError(f"a rate change of x{ratio} is below the model's x{min_ratio}")
    sigma = startup_s / mttf_s
    from .bound_rate_spread import rate_spread_floor

    neighbour, v, x = evidence_floor(ratio, sigma, confidence, min_ratio)
    spread, rho = rate_spread_floor(n, float(ratio), sigma, confidence, search_bits(n, confidence), min_ratio)
    evidence = max(neighbour, spread)
    rate = search_rate(ratio, sigma)
    search = search_bits(n, confidence) / rate
    to_hours = mttf_s / 3600.0
    return RateChangeBound(
        max(evidence, search) * to_hours, evidence * to_hours, search * to_hours, v, x, rate, spread * to_hours, rho
    )
