"""The spread floor for naming a rate change: bound.py's spread floor on bound_rate.py's worlds.

Loads in MTTFs after the change (M); builds J..n-1 hang at rate 1, builds before J at 1/k. Averaged
over the change point J (uniform over 1..n-1, as the benchmark draws it), a procedure right with
probability c in every world must pay at least this much, because:

* **One world per change point below, at one rate.** Fix rho >= min_ratio / k. W'_J' is the rate
  change at J' < J: builds before J' at 1/k as in W, builds J' and up at rho (J' = 0: one rate
  everywhere, an old hang). Each is a world the procedure must answer (the ratio rho k is at least
  `min_ratio`), so in W'_J' it names any J > J' with probability q(J, J') and those add up to at most
  1 - c; summed over the n - 1 worlds, the shares Q_J = sum over J' < J of q(J, J') add up to at most
  (n - 1)(1 - c), as in bound.py.
* **Each change point's evidence** (Kaufmann, Cappe and Garivier 2016, Lemma 1): against W'_J' the
  builds J'..J - 1 give d(1/k, rho) per MTTF of load and the builds J and up d(1, rho), d(x, y) =
  x ln(x / y) - x + y. With X all the load below J and Y all the load from J on (each at least the
  load the world compares), X d(1/k, rho) + Y d(1, rho) >= d(c, Q_J / J) (the smallest of J shares is
  at most their mean), beside bound_rate's neighbour constraint with Y in place of the load on
  build J alone (larger, so the constraint is weaker and the floor still one): min over the
  neighbours' rates r of Y d(1, r) + X d(1/k, r) >= d(c, 1 - c). The last change point has no
  neighbour above: only r >= min_ratio / k there.
* **Cost**: X + Y + (s / M) probes, probes >= Y + X / k (each hang ends one) and >= Fano's bits
  (one bit per probe at most); the mean over J is bounded by bound.py's Lagrange dual
  (`bound.dual_of_rows`: every price mu of the shared budget and nu in [0, s / M] of the bits gives a
  floor), each cell of the grids over Y and X read at its worst corner, so it is a floor whatever
  the grids.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from soakmatrix.matrix.bisect.bound import binary_divergence

from .bound import _DIVERGENCE_GRID, _MU_GRID, dual_of_rows
from .bound_rate import divergence, least_divergence

_Y_GRID = np.geomspace(1e-2, 400.0, 700)  # load from the change point on, in MTTFs
_X_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 4000.0, 1400)])  # load below it


def _least_below(y: np.ndarray, k: float, need: float, min_ratio: float, last: bool) -> np.ndarray:
    """Per Y: a lower bound on the least X with the neighbours' constraint met (the grid point below
    the first that meets it; +inf where none on the grid does)."""
    v, x = y[:, None], _X_GRID[None, :]
    if last:  # only the neighbour below (the change at J - 1, its rate r at least min_ratio / k):
        # convex in r with its minimum at the pooled rate, so at that rate or at the allowed end
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.maximum((v + x / k) / np.maximum(v + x, 1e-300), min_ratio / k)
        value = v * divergence(1.0, r) + x * divergence(1.0 / k, r)
    else:
        value = least_divergence(v, x, k, min_ratio)
    ok = value >= need
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)
    below = _X_GRID[np.clip(first - 1, 0, None)]
    return np.where(first < 0, np.inf, np.where(first == 0, 0.0, below))


def _rows(
    k: float, sigma: float, confidence: float, rho: float, nu: float, min_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per evidence asked (`bound._DIVERGENCE_GRID`): the least cost of a change point, and of the last."""
    need = binary_divergence(confidence, 1.0 - confidence)
    good, bad = float(divergence(1.0 / k, rho)), float(divergence(1.0, rho))
    ylo, yhi, d = _Y_GRID[:-1, None], _Y_GRID[1:, None], _DIVERGENCE_GRID[None, :]
    out = []
    for last in (False, True):
        # on Y in [ylo, yhi]: X at least its value at yhi (the constraints fall with Y), Y at least ylo
        x = np.maximum(
            _least_below(_Y_GRID[1:], k, need, min_ratio, last)[:, None], np.maximum((d - yhi * bad) / good, 0.0)
        )
        with np.errstate(invalid="ignore"):  # inf x 0 where no X meets it and sigma = nu
            cost = np.where(np.isinf(x), np.inf, x + ylo + (sigma - nu) * (ylo + x / k))
        least = np.min(cost, axis=0)
        out.append(np.minimum(least, _Y_GRID[-1] * (1.0 + sigma - nu)))  # Y beyond the grid
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def rate_spread_floor(
    n: int, k: float, sigma: float, confidence: float, bits: float, min_ratio: float = 4.0
) -> tuple[float, float]:
    """(the floor in MTTFs, the refuting worlds' rate rho): the best of the dual over a grid of rho
    and nu (any of them gives a floor)."""
    best = (0.0, 1.0)
    if n < 2:
        return best
    for rho in np.geomspace(min_ratio / k, 2.0, 12):
        for nu in (0.0, 0.5 * sigma, sigma):
            least, least_last = _rows(k, sigma, confidence, float(rho), float(nu), min_ratio)
            value, mu = dual_of_rows(least, least_last, n, confidence, bits, float(nu), _MU_GRID)
            ratio = _MU_GRID[1] / _MU_GRID[0]
            fine, _ = dual_of_rows(
                least, least_last, n, confidence, bits, float(nu), np.geomspace(mu / ratio, mu * ratio, 21)
            )
            value = max(value, fine)
            if math.isfinite(value) and value > best[0]:
                best = (value, float(rho))
    return best
