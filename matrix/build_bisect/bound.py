"""The least GPU-hours any build bisection must spend, on average, to be right as often as it says.

A floor for the benchmark's planted change points (builds J..n-1 hang with the target signature at
one rate lambda = 1/M, builds before J never do), for any procedure, adaptive or not, that names
exactly the first bad build with probability at least c whatever the change point and the MTTF. It
is the larger of two floors, each valid alone (neither adds the other's cost, so the true floor is
higher still): the evidence floor (against the neighbour below, and spread over every change point
below) and the search floor.

**The evidence floor** is the flag floor's argument (matrix/bisect/bound.py; Kaufmann, Cappe and
Garivier, JMLR 2016, Lemma 1) on the build axis:

* **The neighbour below.** W: the change point is J. W'(lambda'): it is J - 1 (build J - 1 hangs
  too, at any rate lambda'). In W the procedure names J with probability >= c, in W' at most 1 - c
  (there J is wrong; within one world nothing spreads that budget over other answers). The expected
  log-likelihood ratio of W to W' must reach d(c, 1 - c). Per unit of load, build J - 1 (it hangs in
  W' only) contributes lambda'; a bad build (it hangs in both) contributes
  lambda ln(lambda / lambda') - lambda + lambda'. With X the expected load on build J - 1 and Y on
  the bad builds, the worst lambda' = lambda Y / (X + Y) leaves lambda Y ln(1 + X / Y) >= d(c, 1-c).
* **The neighbour above.** W'': the change point is J + 1. No likelihood ratio bounds it (build J
  never hangs in W''), but the procedure must see build J hang with probability >= 2c - 1, so
  lambda Y >= 2c - 1.
* **Probes.** Each hang ends a probe: lambda Y probes on bad builds; build J - 1 needs a probe with
  probability >= 2c - 1 (else W and W' look the same); and one probe tells at most one bit, so there
  are at least as many probes as the search floor's I bits (below). Probes >= max(lambda Y + 2c - 1,
  I), each paying its start-up s.

It minimises X(Y) + Y + (s / M) probes(Y) over Y >= 2c - 1, in MTTFs; the search costs it start-ups
only. That is the **neighbour floor**.

**The spread floor** asks more of the same evidence. Averaged over the
change point, the error budget is shared by every change point below the answer, not spent whole on
its neighbour:

* **Worlds at one rate.** Fix rho in (0, 1] and, for every J', the world W'_J' = W(J', rho lambda)
  (builds J'.. hang at rho lambda; J' = 0: even the good build does, "not a regression"). In W'_J'
  the procedure is right with probability >= c, so the answers J > J' it gives there share at most
  1 - c: sum over J of q(J, J') <= 1 - c, with q(J, J') = P_W'_J'(names J). Over the N = n - 1
  change points J' = 0..N - 1 that have a J above them, sum over J of Q_J <= N (1 - c), where
  Q_J = sum over J' < J of q(J, J').
* **Each change point's evidence.** In W (change point J), Lemma 1 against W'_J' for each J' < J:
  the good builds J'..J - 1 give rho per MTTF of load, the bad ones g(rho) = rho - 1 - ln rho, so
  rho X + g(rho) Y >= d(c, q(J, J')) with X all the load on good builds. The smallest of the J
  shares q(J, J') is at most Q_J / J: **rho X + g(rho) Y >= d(c, Q_J / J)**, beside the neighbour's
  constraint. The rate is one for every J' (the shares sum to 1 - c only within one world), so the
  floor is the best over rho of the bound at each.
* **Cost.** The mean over J (uniform, as the benchmark draws it) of X + Y + (s / M) probes, with
  probes >= Y + max(beta (X + Y), 2c - 1) per change point and >= Fano's I bits on average, is at
  least the Lagrange dual: for every mu >= 0 (the shared budget's price) and nu in [0, s / M] (the
  bits'), mean over J of min over Q, Y [X + Y + (s / M - nu) probes + mu Q] - mu (1 - c) + nu I
  (weak duality; any mu, nu gives a floor). Each inner minimum is read on grids and bounded on each
  interval by its worst corner, so the value is a floor whatever the grids; `spread_floor` takes
  the best over rho and nu.
* The last change point (J = n - 1) has no neighbour above among the worlds (no build bad is not
  one), so nothing asks Y >= 2c - 1 of it; below that its X is at least X(2c - 1), over 96 MTTFs at
  0.99, so this never binds (nor in the neighbour floor, whose optimum Y is about 4).
* The worlds include J' = 0 (the good build hangs too): the procedure must say "not a regression"
  there, as `bisect --builds` does. A procedure allowed to take the good build as
  good would have one share fewer per change point and none to refute below J = 1.
* With Q_J / J = (1 - c) / J, the evidence grows from d(c, 1 - c) to about d(c, 1 - c) + c ln J:
  refuting every change point below at once, on the same load, costs more the more there are. A
  procedure must tell J from each of them with a share of the budget, and does so with the load on
  the good builds between (the last good build's soak counts for all of them). n = 32, MTTF 38 min:
  13.1 GPU-hours (20.7 MTTFs) against the neighbour floor's 8.6 (13.6); n = 8: 10.7 against 8.6;
  n = 2 (one change point): the neighbour floor.

**With a background hang** (every build also hangs with another signature at MTTF B, independent of
the change point: the benchmark's "+flaky"), the evidence is unchanged (those hangs have one law in
W and W') but each of them ends a probe too. They come at beta = M / B per MTTF of load, so over the
expected load, at least X + Y, they end beta (X + Y) probes on average (optional stopping: their count
less beta x the load is a martingale in load time). A probe ends with a target hang, another
signature's hang or its length, and build J - 1's last probe (needed with probability >= 2c - 1)
ends with one of the last two, so probes >= max(Y + max(beta (X + Y), 2c - 1), I). The search floor
is unchanged: a soak cut short by another hang tells what a soak of that length tells, for a
start-up paid once, so its bits per MTTF are a mixture of what `search_rate` maximises.

**The search floor.** With the change point uniform over the n - 1 builds after the good one,
Fano's inequality asks for I >= log2(n - 1) - h(1 - c) - (1 - c) log2(n - 2) bits about J. A probe
of build i tells about J only through "is build i bad" (B, with P(B) = p given what was seen): a
bad build's hang time has the same law under every J that calls it bad. So a soak of length L
(in MTTFs, q = e^-L) tells at most h(p (1 - q)) - p h(q) bits and costs s / M + p (1 - q) +
(1 - p) L MTTFs of start-up and load: a good build passes the whole soak. Over every p and L, a
GPU-hour buys at most r bits (`search_rate`), and by the chain rule of mutual information over an
adaptive sequence of probes the expected cost is at least I / r. This is what the evidence floor
leaves out: a probe tells at most one bit **and** a bit costs load, not only a start-up (the floor
before this one charged the search start-ups only, one bit each, and so stayed flat in n; at 128
and 512 builds the search floor is the larger).

The evidence floor is the larger of the neighbour and spread floors. Both it and the search floor
leave out the calibration and the search's overlap with the evidence (they are not added): a
floor, not an estimate.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from soakmatrix.matrix.bisect.bound import binary_divergence, refute_load


@dataclass(frozen=True)
class BuildBound:
    gpu_hours: float  # the least expected GPU-hours: the larger of the two floors
    hang_mttfs: float  # Y: load on bad builds, in MTTFs (about that many hangs), and X: load
    refute_mttfs: float  # on the last good build, both at the neighbour floor's optimum
    probes: float  # the least expected number of probes of the neighbour floor
    evidence: float  # d(c, 1 - c): the log-likelihood ratio against the neighbour below
    search_bits: float  # I: what Fano's inequality asks of the search
    evidence_gpu_hours: float = 0.0  # the evidence floor alone: the larger of neighbour and spread
    search_gpu_hours: float = 0.0  # the search floor alone: I / search_rate
    bits_per_mttf: float = 0.0  # the search rate r: bits per MTTF of start-up and load
    neighbour_gpu_hours: float = 0.0  # the evidence floor against the neighbour below alone
    spread_rho: float = 1.0  # the spread floor's refuting rate, a share of the bad builds'


def search_bits(n: int, confidence: float) -> float:
    """Fano: bits any procedure right with probability c must learn about a change point uniform
    over the n - 1 builds after the good one."""
    m = n - 1
    if m <= 1:
        return 0.0
    alpha = 1.0 - confidence
    h = -(alpha * math.log2(alpha) + confidence * math.log2(confidence))
    return max(0.0, math.log2(m) - h - alpha * math.log2(m - 1))


def _h2(x):
    x = np.clip(x, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(x > 0, -x * np.log2(np.where(x > 0, x, 1.0)), 0.0)
        b = np.where(x < 1, -(1 - x) * np.log2(np.where(x < 1, 1 - x, 1.0)), 0.0)
    return a + b


def probe_bits(p, length):
    """The most a soak of `length` MTTFs tells about the change point when the build is bad with
    probability p: I(B; outcome) = h(p (1 - q)) - p h(q), q = e^-length."""
    q = np.exp(-np.asarray(length, dtype=float))
    return _h2(p * (1 - q)) - p * _h2(q)


def probe_cost(p, length, sigma):
    """Expected start-up and load of that soak, in MTTFs (sigma = start-up / MTTF)."""
    q = np.exp(-np.asarray(length, dtype=float))
    return sigma + p * (1 - q) + (1 - p) * length


def search_rate(sigma: float) -> tuple[float, float, float]:
    """(r, p, L): the most bits per MTTF of start-up and load any probe buys, and where."""
    if sigma < 0:
        raise ValueError(f"the start-up must be >= 0, got {sigma}")
    ps = np.linspace(0.005, 0.995, 199)[:, None]
    ls = np.exp(np.linspace(-6.0, 5.0, 441))[None, :]
    grid = probe_bits(ps, ls) / probe_cost(ps, ls, sigma)
    i, j = np.unravel_index(int(np.argmax(grid)), grid.shape)

    def neg(v):
        p, length = float(np.clip(v[0], 1e-6, 1 - 1e-6)), math.exp(v[1])
        return -float(probe_bits(p, length) / probe_cost(p, length, sigma))

    best = minimize(
        neg, [float(ps[i, 0]), math.log(float(ls[0, j]))], method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12}
    )
    p, length = float(np.clip(best.x[0], 1e-6, 1 - 1e-6)), math.exp(best.x[1])
    return max(-best.fun, float(grid[i, j])), p, length


def _divergences(confidence: float, q: np.ndarray) -> np.ndarray:
    """d(c, q) elementwise: 0 where q >= c (nothing to tell apart), +inf at q = 0."""
    q = np.asarray(q, dtype=float)
    out = np.zeros_like(q)
    live = q < confidence
    c, ql = confidence, q[live]
    with np.errstate(divide="ignore"):
        out[live] = c * np.log(c / ql) + (1 - c) * np.log((1 - c) / (1 - ql))
    return out


# Grids of the spread floor's inner minimisations. Every value it returns is a lower bound whatever
# the grids (each interval between two grid points is bounded by its worst corner), so the grids
# only set how close to the exact minimum it gets.
_HANG_GRID = np.geomspace(1.0, 400.0, 900)  # Y, in units of 2c - 1
_DIVERGENCE_GRID = np.linspace(0.0, 30.0, 601)
_SHARE_GRID = np.geomspace(1e-10, 1.0, 401)  # u = Q_J / J
_MU_GRID = np.geomspace(1e-2, 1e5, 71)


@dataclass(frozen=True)
class SpreadFloor:
    mttfs: float  # the floor, in MTTFs of start-up and load
    rho: float  # the refuting worlds' rate, as a share of the bad builds'
    mu: float  # the price of the shared error budget (its Lagrange multiplier)
    nu: float  # the price of the search's probes (Fano's bits)


def _dual_values(
    n: int, sigma: float, confidence: float, bits: float, beta: float, rho: float, nu: float, mus: np.ndarray
) -> tuple[float, float]:
    """The dual's best value over `mus`, and the mu that gives it."""
    c = confidence
    if not (0 < rho <= 1 and 0 <= nu <= sigma):
        raise ValueError(f"need 0 < rho <= 1 and 0 <= nu <= sigma, got rho={rho}, nu={nu}")
    floor_y = 2.0 * c - 1.0
    neighbour = binary_divergence(c, 1.0 - c)
    gap = rho - 1.0 - math.log(rho)  # KL per MTTF of a bad build's load against rate rho
    ys = floor_y * _HANG_GRID
    ylo, yhi, d = ys[:-1, None], ys[1:, None], _DIVERGENCE_GRID[None, :]
    # On Y in [ylo, yhi]: the least X that meets both constraints is at most its value at yhi (it
    # falls with Y), the hang load and its probes at least theirs at ylo.
    x = np.maximum(np.maximum(yhi * np.expm1(neighbour / yhi), (d - yhi * gap) / rho), 0.0)
    probes = ylo + np.maximum(beta * (x + ylo), floor_y)
    least = np.min(x + ylo + (sigma - nu) * probes, axis=0)
    least = np.minimum(least, ys[-1] * (1.0 + sigma - nu))  # Y beyond the grid
    # The last change point has no neighbour above among the worlds (every build good is not one),
    # so nothing asks Y >= 2c - 1 of it: below that, X is at least its value at 2c - 1.
    x_at_floor = np.maximum(
        np.maximum(floor_y * math.expm1(neighbour / floor_y), (_DIVERGENCE_GRID - floor_y * gap) / rho), 0.0
    )
    least_last = np.minimum(least, x_at_floor + (sigma - nu) * np.maximum(beta * x_at_floor, floor_y))
    return dual_of_rows(least, least_last, n, confidence, bits, nu, mus)


def dual_of_rows(
    least: np.ndarray, least_last: np.ndarray, n: int, confidence: float, bits: float, nu: float, mus: np.ndarray
) -> tuple[float, float]:
    """The dual's best value over `mus`, and its mu, from each change point's least cost per unit of
    evidence asked (`least[i]`: the least cost of a change point below the last one whose evidence
    against the worlds below must reach `_DIVERGENCE_GRID[i]`; `least_last` the same for the last):
    shared with the rate change's spread floor (bound_rate_spread.py), which asks its own rows."""
    c, rows = confidence, n - 1
    # G(d) >= least[the grid point at or below d]: G rises with d
    need = _divergences(c, _SHARE_GRID)
    at = np.clip(np.searchsorted(_DIVERGENCE_GRID, need, side="right") - 1, 0, None)
    # A row's least cost rises with J (more change points below share its budget), so each J may be
    # read at the start of its block: 1..24 one by one, then geometric blocks, the last alone.
    starts = np.unique(
        np.concatenate([np.arange(1, min(rows, 24) + 1), np.round(np.geomspace(24, max(rows, 24), 48)), [rows]]).astype(
            int
        )
    )
    starts = starts[starts <= rows]
    weights = np.diff(np.append(starts, rows + 1)).astype(float)
    envelope = np.where((starts == rows)[:, None], least_last[None, :], least[None, :])  # (rows, d)
    # phi(J, u): G(d(c, u)) for every share at or above u
    phi = np.where(np.isinf(need)[None, :], np.inf, envelope[:, at])
    js = starts.astype(float)[:, None, None]
    m = np.asarray(mus, dtype=float)[None, None, :]
    u = _SHARE_GRID[None, :, None]
    # Row J with Q = J u, u in [u_k, u_k+1]: G(d(c, u)) + mu Q >= phi(u_k+1) + mu J u_k; below the
    # grid, phi(u_0); above it, G(0) + mu J u_last.
    inside = np.min(phi[:, 1:, None] + m * js * u[:, :-1, :], axis=1)
    below = np.broadcast_to(phi[:, :1], inside.shape)
    above = envelope[:, :1] + m[:, 0, :] * js[:, 0, :] * _SHARE_GRID[-1]
    row = np.minimum(np.minimum(inside, below), above)  # (rows, mus)
    value = weights @ row / rows - m[0, 0, :] * (1.0 - c) + nu * bits
    best = int(np.argmax(value))
    return float(value[best]), float(m[0, 0, best])


def spread_value(
    n: int, sigma: float, confidence: float, bits: float, beta: float, rho: float, nu: float
) -> tuple[float, float]:
    """(the dual's value, its mu) at one refuting rate rho and one price nu of the search's probes:
    a lower bound on the mean cost in MTTFs for every rho in (0, 1], nu in [0, sigma], mu >= 0. The
    dual is concave in mu: a coarse grid, then a fine one around its best point."""
    value, mu = _dual_values(n, sigma, confidence, bits, beta, rho, nu, _MU_GRID)
    ratio = _MU_GRID[1] / _MU_GRID[0]
    fine = np.geomspace(mu / ratio, mu * ratio, 41)
    value2, mu2 = _dual_values(n, sigma, confidence, bits, beta, rho, nu, fine)
    return (value2, mu2) if value2 > value else (value, mu)


@functools.lru_cache(maxsize=256)  # a few seconds each; the benchmark asks for each row's twice
def spread_floor(n: int, sigma: float, confidence: float, bits: float, beta: float = 0.0) -> SpreadFloor:
    """The evidence floor with the error budget spread over the change points below (module
    docstring), in MTTFs: the best of `spread_value` over a grid of rho and nu, then refined."""
    best = SpreadFloor(-math.inf, 1.0, 0.0, 0.0)
    for rho in np.geomspace(0.05, 1.0, 11):
        for nu in (0.0, 0.5 * sigma, sigma):
            value, mu = spread_value(n, sigma, confidence, bits, beta, float(rho), float(nu))
            if value > best.mttfs:
                best = SpreadFloor(value, float(rho), mu, float(nu))

    def neg(v):
        rho = float(np.clip(math.exp(v[0]), 1e-3, 1.0))
        nu = float(np.clip(v[1], 0.0, sigma))
        return -spread_value(n, sigma, confidence, bits, beta, rho, nu)[0]

    local = minimize(
        neg, [math.log(best.rho), best.nu], method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-6, "maxfev": 40}
    )
    rho, nu = float(np.clip(math.exp(local.x[0]), 1e-3, 1.0)), float(np.clip(local.x[1], 0.0, sigma))
    value, mu = spread_value(n, sigma, confidence, bits, beta, rho, nu)
    return SpreadFloor(value, rho, mu, nu) if value > best.mttfs else best


def lower_bound(
    n: int, mttf_s: float, startup_s: float, confidence: float, gpus: int = 1, background_mttf_s: float | None = None
) -> BuildBound:
    """The least expected GPU-hours to name the first bad build among `n` with probability
    `confidence`, for a procedure that keeps that confidence at every change point and MTTF; with
    `background_mttf_s`, every build also hangs with another signature at that MTTF."""
    if n < 2:
        raise ValueError(f"need at least two builds, got {n}")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    evidence = binary_divergence(confidence, 1.0 - confidence)
    bits = search_bits(n, confidence)
    if background_mttf_s is not None and not background_mttf_s > 0:
        raise ValueError(f"the background hang's MTTF must be > 0, got {background_mttf_s}")
    sigma = startup_s / mttf_s
    beta = mttf_s / background_mttf_s if background_mttf_s else 0.0
    floor_y = 2.0 * confidence - 1.0

    def probes(y: float) -> float:
        return max(y + max(beta * (refute_load(y, evidence) + y), 2.0 * confidence - 1.0), bits)

    def cost(y: float) -> float:
        return refute_load(y, evidence) + y + sigma * probes(y)

    best = minimize_scalar(cost, bounds=(floor_y, 500.0), method="bounded", options={"xatol": 1e-7})
    y = float(best.x)
    if cost(floor_y) < best.fun:
        y = floor_y
    rate = search_rate(sigma)[0]
    to_hours = gpus * mttf_s / 3600.0
    neighbour_hours, search_hours = cost(y) * to_hours, bits / rate * to_hours
    spread = spread_floor(n, sigma, confidence, bits, beta)
    evidence_hours = max(neighbour_hours, spread.mttfs * to_hours)
    return BuildBound(
        gpu_hours=max(evidence_hours, search_hours),
        hang_mttfs=y,
        refute_mttfs=refute_load(y, evidence),
        probes=probes(y),
        evidence=evidence,
        search_bits=bits,
        evidence_gpu_hours=evidence_hours,
        search_gpu_hours=search_hours,
        bits_per_mttf=rate,
        neighbour_gpu_hours=neighbour_hours,
        spread_rho=spread.rho,
    )
