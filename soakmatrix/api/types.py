"""The API's typed inputs and answers that are not the engine's own: the options of a bisection,
a flag and a build bisection's answers, a cell event for `run`'s progress callback and a watch's
answer. Frozen dataclasses; importing this module loads no optional extra."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_BISECT_OUT = "bisect-out"


@dataclass(frozen=True)
class BisectOptions:
    """How a flag or build bisection runs (the `soakmatrix bisect` flags, by the same names)."""

    signature: str | None = None  # the hang to bisect; None: the store's newest, the hang model's, the calibration's
    confidence: float = 0.95  # the stated confidence of the answer (0 < c < 1)
    virtual: bool = False  # virtual time: hangs drawn from the hang model, no Ray, no soak
    hang_model: str | None = None  # hang-model file; None: the matrix's sim.hang_model
    seed: int | None = None  # the virtual oracle's seed / the simulated engine's seed base
    calibration_hangs: int = 2  # hangs of the failing cell first
    parallel: int | None = None  # probes per batch; None: 1 virtual, 2 on Ray (builds: 1)
    budget_gpu_hours: float | None = None  # stop (inconclusive) after this many GPU-hours
    max_probes: int = 200  # stop (inconclusive) after this many probes
    backend: str = "sim"  # real probes' engine: "sim" or "vllm"
    ray_address: str | None = None  # real probes' Ray cluster; None: $RAY_ADDRESS, else a local one
    out: str | None = None  # soak artifacts and the probe journal; None: bisect-out (virtual: none)
    max_soak_s: float | None = None  # soak a longer probe in pieces of at most this; None: 12 h real, none virtual
    resume: bool = False  # replay the probe journal in `out` first
    store: str | None = None  # history store: the signature, free exposure, and the answer recorded
    # the flag bisection only
    mttf_cap_s: float | None = None  # the smallest set that hangs with MTTF at most this; None: no cap
    modifier_prior: float | None = None  # P(one flag outside the set slows the hang x6+); None: the default 0.3
    shrink: bool = True  # try other values of the set's flags
    measure_modifiers: bool = True  # soak the flags outside the set for modifier verdicts
    emit_test: str | None = None  # write a pytest regression test for the minimal set here
    # the build bisection only
    build_template: str | None = None  # a pip spec with {sha}, for builds given as GOOD..BAD commits
    checkout: str = "."  # the git checkout GOOD..BAD is read from
    junit: str | None = None  # the answer's JUnit XML here, a test case per signature

    @classmethod
    def from_args(cls, args: Any) -> BisectOptions:
        """The options of `soakmatrix bisect` (its parsed flags)."""
        return cls(
            signature=args.signature,
            confidence=args.confidence,
            virtual=args.virtual,
            hang_model=args.hang_model,
            seed=args.seed,
            calibration_hangs=args.calibration_hangs,
            parallel=args.parallel,
            budget_gpu_hours=args.budget_gpu_hours,
            max_probes=args.max_probes,
            backend=args.backend,
            ray_address=args.ray_address,
            out=args.out,
            max_soak_s=args.max_soak,
            resume=args.resume,
            store=args.store,
            mttf_cap_s=args.mttf_cap,
            modifier_prior=args.modifier_prior,
            shrink=not args.no_shrink,
            measure_modifiers=not args.no_modifiers,
            emit_test=args.emit_test,
            build_template=args.build_template,
            checkout=args.checkout,
            junit=args.junit,
        )

    def replaced(self, overrides: Mapping[str, Any]) -> BisectOptions:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown bisection option(s): {', '.join(unknown)}")
        return type(self)(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **overrides})

    @property
    def journal_dir(self) -> Path | None:
        """Where the probe journal goes: `out`; real probes default to bisect-out, virtual ones keep none."""
        if self.out:
            return Path(self.out)
        return None if self.virtual else Path(DEFAULT_BISECT_OUT)


@dataclass(frozen=True)
class FlagBisection:
    """A finished flag bisection of one cell."""

    status: str  # "found", "not_reproduced" or "inconclusive"
    exit_code: int  # the CLI's: 1 found, 0 not reproduced, 3 inconclusive
    cell: Any  # the failing cell (PlannedCell) as bisected
    result: Any  # the bisection's full answer (matrix.bisect BisectResult)
    doc: Mapping[str, Any]  # the JSON document (`--json`; what the store records)
    text: str  # the human-readable report
    warnings: tuple[str, ...] = ()  # what failed after the answer (the regression test, the store)

    @property
    def minimal_set(self) -> tuple[str, ...]:
        """The names of the flags of the minimal set that still hangs (() unless found)."""
        return tuple(self.result.minimal) if self.status == "found" else ()

    @property
    def minimal_flags(self) -> dict[str, Any]:
        """The whole config that hangs with only the minimal set moved off the baseline ({} unless found)."""
        return dict(self.result.minimal_flags) if self.status == "found" else {}

    @property
    def signature(self) -> str | None:
        return self.result.signature


@dataclass(frozen=True)
class BuildBisection:
    """A finished build bisection of one cell (and the flag bisection on its first bad build)."""

    status: str  # found, range, rate_change, not_a_regression, not_reproduced, ...
    exit_code: int  # the CLI's: 1 found, 0 no regression, 3 inconclusive, 2 bad build untestable
    cell: Any  # the failing cell (PlannedCell)
    result: Any  # the build bisection's full answer (BuildBisectResult)
    doc: Mapping[str, Any]  # the JSON document (without the flags': see `flags`)
    text: str  # the human-readable report
    flags: FlagBisection | None = None  # `then_flags`: the flags of the cell on the first bad build

    @property
    def first_bad_build(self) -> str | None:
        return self.result.first_bad_build


@dataclass(frozen=True)
class CellEvent:
    """What `run`'s progress callback hears, once per cell start, retry and result."""

    kind: str  # "started", "retrying" or "finished"
    cell: Any  # the cell (PlannedCell)
    result: Any = None  # its CellResult ("retrying": the infra error; "finished": the verdict)
    attempt: int = 1  # "started": which attempt (1 + infra retries)
    node: str = ""  # "started": the Ray node it was placed on


@dataclass(frozen=True)
class WatchResult:
    """A watch that stopped (its duration, its incident count, or a stop event)."""

    exit_code: int  # the CLI's: 1 when an incident was caught, else 0
    incidents: tuple[Any, ...]  # each incident (jobs.watch Incident): .result (a CellResult), .folder
    notes: tuple[str, ...] = ()  # what the watch said, in order (secrets scrubbed)

    @property
    def results(self) -> tuple[Any, ...]:
        """Each incident's CellResult: signature, causes, evidence folder."""
        return tuple(i.result for i in self.incidents)
