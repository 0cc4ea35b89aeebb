"""The least GPU-hours any build bisection must spend, on average, to be right as often as it says.

A floor for the benchmark's planted change points (builds J..n-1 hang with the target signature at
one rate lambda = 1/M, builds before J never do), for any procedure, adaptive or not, that names
exactly the first bad build with probability at least c whatever the change point and the MTTF. It
is the larger of two floors, each valid alone (neither adds the other's cost, so the true floor is
higher still).

**The evidence floor** is the flag floor's argument (matrix/bisect/bound.py; Kaufmann, Cappe and
Garivier, JMLR 2016, Lemma 1) on the build axis:

* **The neighbour below.** W: the change point is J. W'(lambda'): it is J - 1 (build J - 1 hangs
  too, at any rate lambda'). In W the procedure names J with probability >= c, in W' at most 1 - c
  (there J is wrong; the builds are ordered, so no symmetry spreads that budget). The expected
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
only.

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

Both leave out the calibration and the rate's being unknown to the procedure: a floor, not an
estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from soakmatrix.matrix.bisect.bound import binary_divergence, refute_load


@dataclass(frozen=True)
class BuildBound:
    gpu_hours: float         # the least expected GPU-hours: the larger of the two floors
    hang_mttfs: float        # Y: load on bad builds, in MTTFs (about that many hangs)
    refute_mttfs: float      # X: load on the last good build, in MTTFs
    probes: float            # the least expected number of probes of the evidence floor
    evidence: float          # d(c, 1 - c): the log-likelihood ratio against the neighbour below
    search_bits: float       # I: what Fano's inequality asks of the search
    evidence_gpu_hours: float = 0.0   # the evidence floor alone
    search_gpu_hours: float = 0.0     # the search floor alone: I / search_rate
    bits_per_mttf: float = 0.0        # the search rate r: bits per MTTF of start-up and load


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

    best = minimize(neg, [float(ps[i, 0]), math.log(float(ls[0, j]))], method="Nelder-Mead",
                    options={"xatol": 1e-9, "fatol": 1e-12})
    p, length = float(np.clip(best.x[0], 1e-6, 1 - 1e-6)), math.exp(best.x[1])
    return max(-best.fun, float(grid[i, j])), p, length


def lower_bound(n: int, mttf_s: float, startup_s: float, confidence: float, gpus: int = 1,
                background_mttf_s: float | None = None) -> BuildBound:
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
    evidence_hours, search_hours = cost(y) * to_hours, bits / rate * to_hours
    return BuildBound(gpu_hours=max(evidence_hours, search_hours), hang_mttfs=y,
                      refute_mttfs=refute_load(y, evidence), probes=probes(y), evidence=evidence,
                      search_bits=bits, evidence_gpu_hours=evidence_hours, search_gpu_hours=search_hours,
                      bits_per_mttf=rate)
