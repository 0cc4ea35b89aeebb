"""What bisection works with and hands back: elements, settings, what was seen on each config, the
result and its per-flag verdicts, and the default MTTF cap every stage reads.

Elements are the flags whose value in the failing cell differs from the matrix baseline; a config is
baseline + a subset of them, named by a bitmask (bit i: element i at its failing-cell value).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from soakmatrix.matrix.contracts import stats

from .oracle import ProbeResult
from .policy import DEFAULT_POLICY, Policy


@dataclass(frozen=True)
class Element:
    """A flag whose failing-cell value differs from the baseline."""

    name: str
    value: Any  # in the failing cell
    baseline: Any


@dataclass(frozen=True)
class Settings:
    confidence: float = 0.95
    mttf_cap_s: float | None = None  # None: cap_factor x the pooled MTTF's 99% upper bound
    cap_factor: float = 2.0  # two calibration hangs in E start the cap at ~13 E
    startup_s: float = 600.0  # expected start-up per probe (for choosing probes)
    calibration_hangs: int = 2
    calibration_max_soak_s: float | None = None  # per calibration probe; None: the policy's (24 h, or 8 x cap)
    parallel: int = 1  # probes per batch
    max_probes: int = 200
    budget_gpu_hours: float | None = None
    shrink_values: bool = True
    verify_cap: bool | None = None  # soak each element out to the cap; None: only with an explicit cap
    probe_correction: float = 1.0  # per-probe miss = alpha / (expected remaining probes)^this
    slow_zero_prior: float = 0.99  # how conclusive one hang is: odds ~ 2 cap / (M (1 - this))
    modifier_prior: float = 0.3  # P(one flag outside the set slows the hang x6 or more); 0: no rate check
    ablation: bool = True  # remove one flag at a time first; False: the posterior search only
    rule_out_factor: float = 8.0  # "necessary": no hang without it, soaked until a slowdown up to this is ruled out
    measure_modifiers: bool = True  # soak the flags outside the set for modifier verdicts (modifiers.py)
    policy: Policy = DEFAULT_POLICY  # every constant that changes an answer or a cost (policy.py)


DEFAULT_SETTINGS = Settings()


@dataclass
class ConfigStats:
    """Everything seen on one config; exposure pools across its probes."""

    mask: int
    label: str
    flags: dict[str, Any]
    hangs: int = 0  # with the failing cell's signature
    other_hangs: int = 0  # other signatures (ended a probe early)
    exposure_s: float = 0.0
    probes: int = 0
    gpu_hours: float = 0.0
    errors: int = 0  # config_error / infra_error probes
    longest_s: float = 0.0  # the longest soak a probe of it asked for
    role: str = "search"  # calibration | search | certification | shrink

    def mttf(self, confidence: float) -> stats.MttfEstimate:
        return stats.mttf_estimate(self.hangs, self.exposure_s, confidence)


@dataclass(frozen=True)
class FlagVerdict:
    element: Element
    kind: str  # necessary | modifier | irrelevant | context
    text: str  # e.g. "modifier x8.1 (p=0.002)"
    ratio: float | None = None  # rate with the flag / rate without it
    p_value: float | None = None
    ratio_low: float | None = None  # the ratio's interval at the stated confidence
    ratio_high: float | None = None


@dataclass(frozen=True)
class ValueProbe:
    flag: str
    value: Any
    hangs: int
    exposure_s: float
    verdict: str  # "hangs" | "MTTF > X at c" | "infeasible: ..."


@dataclass
class BisectResult:
    status: str  # found | not_reproduced | inconclusive
    signature: str | None
    elements: list[Element]
    context: dict[str, Any]
    minimal: list[str]  # element names of the minimal set
    posterior: float  # P(minimal set is the answer | data)
    confidence: float
    mttf_cap_s: float
    failing: stats.MttfEstimate | None
    minimal_mttf: stats.MttfEstimate | None
    certified_soak_s: float | None  # soak that sees the minimal set hang with prob = confidence
    verdicts: list[FlagVerdict]
    configs: list[ConfigStats]
    values: list[ValueProbe]
    probes: int
    gpu_hours: float
    notes: list[str] = field(default_factory=list)
    log: list[ProbeResult] = field(default_factory=list)
    minimal_flags: dict[str, Any] = field(default_factory=dict)
    gpu_hours_by_role: dict[str, float] = field(default_factory=dict)  # calibration, search, rate check, ...
    rate_added: list[str] = field(default_factory=list)  # flags of the minimal set the rate check put there
    signature_source: str = ""  # where the target signature came from (option, history, hang model, ...)
    other_signatures: dict[str, int] = field(default_factory=dict)  # hangs of other signatures: they only ended probes
    shrunk: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # flag -> {"from": failing, "to": smallest that hangs}


FeasibleFn = Callable[[Mapping[str, Any]], str | None]  # why a flag dict cannot run, or None
GpuCountFn = Callable[[Mapping[str, Any]], int]


def default_gpu_count(flags: Mapping[str, Any]) -> int:
    return int(flags.get("tp", 1) or 1)


def default_cap(hangs: int, exposure_s: float, factor: float = 2.0, policy: Policy = DEFAULT_POLICY) -> float:
    """The MTTF cap derived from the failing cell (later: from the configs that share its rate).

    `factor` x the MTTF's 99% upper bound while few hangs are in (so a noisy calibration, two
    lucky early hangs, does not put the failing cell itself above the cap), tightening to
    `policy.point_cap_factor` x the point estimate as hangs pool up, never below the upper bound. A cap that
    settles near a fixed multiple of the MTTF keeps a modifier's verdict (is the hang without it
    slower than the cap?) away from a coin toss on the cap's own noise."""
    upper = stats.mttf_upper_bound(hangs, exposure_s, policy.cap_bound_confidence)
    if hangs <= 0:
        return factor * upper
    return max(upper, min(factor * upper, policy.point_cap_factor * exposure_s / hangs))
