"""The least GPU-hours any flag bisection must spend, on average, to be right as often as it says.

A lower bound for the benchmark's planted conjunctions (k of n flags, every config that holds all k
hangs at one rate 1/M, no other config hangs), for any procedure, adaptive or not, that returns
exactly the true set with probability at least c whatever the MTTF, for every k, when the planted
flags sit at random positions. It is what `benchmarks/bench_bisect.py` measures bisection against,
next to the information bound ceil(log2 C(n, k)) probes, which leaves out that each probe's answer
is a random time, not a bit.

The argument (docs/design/bisection-algorithm.md, "How low can it go"): to return T, the procedure must tell the world W
where T hangs at rate lambda from the world W' where T minus one flag t already hangs, at any rate
lambda'. In W' the procedure may return T (a superset: wrong) for only a share of its error budget;
the flags are exchangeable, so that share is at most q = (1 - c) / (n - k + 1), the n - k + 1 sets
"T minus t plus one more flag" being equally likely wrong answers. By the divergence decomposition
of adaptive experiments and the data-processing inequality (Kaufmann, Cappe and Garivier, JMLR 2016,
Lemma 1), the expected log-likelihood ratio of W to W' must reach d(c, q), the binary relative
entropy. Per unit of load, a config that hangs in W' but not in W contributes lambda', one that hangs
in both contributes lambda ln(lambda / lambda') - lambda + lambda'. With X the expected load on
configs that hold T but t and Y the expected load on configs that hold T, minimising over lambda'
leaves lambda Y ln(1 + X / Y) >= d(c, q) for each of the k flags t. Every hang ends a probe, so Y
brings lambda Y start-ups with it; each of the k classes of configs needs a probe of its own at least
with probability c - q. The bound minimises k X + Y (1 + lambda s) + k (c - q) s over Y, s being the
start-up: it leaves out the search itself, the calibration, and any check for modifiers or second
triggers, each of which only adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import minimize_scalar


@dataclass(frozen=True)
class Bound:
    gpu_hours: float  # the least expected GPU-hours
    hang_mttfs: float  # Y: load on configs that hang, in MTTFs (about that many hangs)
    refute_mttfs: float  # X: load without each flag of the set, in MTTFs, per flag
    evidence: float  # d(c, q): the log-likelihood ratio each flag of the set must reach


def binary_divergence(p: float, q: float) -> float:
    """d(p, q) = p ln(p / q) + (1 - p) ln((1 - p) / (1 - q)), in nats."""
    out = 0.0
    if p > 0:
        out += p * math.log(p / q)
    if p < 1:
        out += (1 - p) * math.log((1 - p) / (1 - q))
    return out


def refute_load(hang_mttfs: float, evidence: float) -> float:
    """X, in MTTFs, such that Y ln(1 + X / Y) = evidence (Y = hang_mttfs)."""
    return hang_mttfs * math.expm1(evidence / hang_mttfs)


def lower_bound(n: int, k: int, mttf_s: float, startup_s: float, confidence: float, gpus: int = 1) -> Bound:
    """The least expected GPU-hours to return exactly the k culprits among n flags with probability
    `confidence`, for a procedure that keeps that confidence at every MTTF and every k."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    alpha = 1.0 - confidence
    q = alpha / (n - k + 1)
    evidence = binary_divergence(confidence, q)
    sigma = startup_s / mttf_s

    def cost(y: float) -> float:
        return k * refute_load(y, evidence) + y * (1.0 + sigma) + k * (confidence - q) * sigma

    best = minimize_scalar(cost, bounds=(0.05, 500.0), method="bounded", options={"xatol": 1e-6})
    y = float(best.x)
    return Bound(
        gpu_hours=gpus * float(best.fun) * mttf_s / 3600.0,
        hang_mttfs=y,
        refute_mttfs=refute_load(y, evidence),
        evidence=evidence,
    )
