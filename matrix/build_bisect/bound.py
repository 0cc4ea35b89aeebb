"""The least GPU-hours any build bisection must spend, on average, to be right as often as it says.

A floor for the benchmark's planted change points (builds J..n-1 hang with the target signature at
one rate lambda = 1/M, builds before J never do), for any procedure, adaptive or not, that names
exactly the first bad build with probability at least c whatever the change point and the MTTF. It
is the flag floor's argument (matrix/bisect/bound.py; Kaufmann, Cappe and Garivier, JMLR 2016,
Lemma 1) on the build axis:

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
  probability >= 2c - 1 (else W and W' look the same). And the search: with the change point
  uniform over the n - 1 builds after the good one, Fano's inequality asks for
  I >= log2(n - 1) - h(1 - c) - (1 - c) log2(n - 2) bits, and one probe tells at most one bit (its
  outcome depends on J only through "is this build bad"). So the probes are at least
  max(lambda Y + 2c - 1, I), each paying its start-up s.

The bound minimises X(Y) + Y + (s / M) max(Y + 2c - 1, I) over Y >= 2c - 1, in MTTFs. It leaves out
the search's load on good builds, the calibration and the rate's being unknown to the procedure:
a floor, not an estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import minimize_scalar

from soakmatrix.matrix.bisect.bound import binary_divergence, refute_load


@dataclass(frozen=True)
class BuildBound:
    gpu_hours: float         # the least expected GPU-hours
    hang_mttfs: float        # Y: load on bad builds, in MTTFs (about that many hangs)
    refute_mttfs: float      # X: load on the last good build, in MTTFs
    probes: float            # the least expected number of probes
    evidence: float          # d(c, 1 - c): the log-likelihood ratio against the neighbour below
    search_bits: float       # I: what Fano's inequality asks of the search


def search_bits(n: int, confidence: float) -> float:
    """Fano: bits any procedure right with probability c must learn about a change point uniform
    over the n - 1 builds after the good one."""
    m = n - 1
    if m <= 1:
        return 0.0
    alpha = 1.0 - confidence
    h = -(alpha * math.log2(alpha) + confidence * math.log2(confidence))
    return max(0.0, math.log2(m) - h - alpha * math.log2(m - 1) if m > 1 else 0.0)


def lower_bound(n: int, mttf_s: float, startup_s: float, confidence: float, gpus: int = 1) -> BuildBound:
    """The least expected GPU-hours to name the first bad build among `n` with probability
    `confidence`, for a procedure that keeps that confidence at every change point and MTTF."""
    if n < 2:
        raise ValueError(f"need at least two builds, got {n}")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    evidence = binary_divergence(confidence, 1.0 - confidence)
    bits = search_bits(n, confidence)
    sigma = startup_s / mttf_s
    floor_y = 2.0 * confidence - 1.0

    def probes(y: float) -> float:
        return max(y + 2.0 * confidence - 1.0, bits)

    def cost(y: float) -> float:
        return refute_load(y, evidence) + y + sigma * probes(y)

    best = minimize_scalar(cost, bounds=(floor_y, 500.0), method="bounded", options={"xatol": 1e-7})
    y = float(best.x)
    if cost(floor_y) < best.fun:
        y = floor_y
    return BuildBound(gpu_hours=gpus * cost(y) * mttf_s / 3600.0, hang_mttfs=y,
                      refute_mttfs=refute_load(y, evidence), probes=probes(y), evidence=evidence,
                      search_bits=bits)
