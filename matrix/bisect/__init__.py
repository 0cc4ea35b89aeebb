"""Flag bisection for intermittent hangs: the smallest set of flags that still hangs, with confidence.

The algorithm is pure: the probe oracle (oracle.py) is passed in; no clocks, processes or Ray in
it. `bisect_flags(...)` (pipeline.py, the one entry; `bisect` is the same function) runs the phases
in turn: calibrate, search, check the cap and the rate, soak for the modifier verdicts, and write
the verdicts. `Settings.policy` (policy.py) holds every constant that changes an answer or a cost.

- model.py: elements, settings, what was seen on each config, the result and its verdict types;
- search.py: the probe ledger every phase reads (configs, log, posterior), calibration, the cap;
- posterior.py: the posterior over which set of flags is the trigger, and the pooled-rate tests;
- ablation.py: the failing cell without each flag in turn, tried before the posterior search;
- posterior_search.py: the search over every set when ablation cannot decide;
- ratecheck.py: whether the set is enough to hang within the cap, or needs one flag more;
- cap_check.py: the flags that leave the set after the search (within the cap, or seen without);
- modifiers.py, modifier_reads.py, modifier_stats.py: the soaks for, and the calls of, modifiers;
- verdicts.py: other values of the set's flags, and a verdict per flag.

A second, independent trigger (an OR of conjunctions) shows as hangs in configs without the answer:
the search still converges on one minimal set and the result says others may exist.

Around the algorithm: setup.py (a bisection from a matrix cell), emit.py (the `--emit-test`
regression test), report.py (text and JSON), bound.py (the least cost of any bisection on the old
question; the default question's is benchmarks/bound_default.py), journal.py, and the oracles
(oracle_virtual.py, oracle_soak.py, and the wrappers oracle_restart.py, oracle_chunked.py,
oracle_lazy.py). Design notes: docs/design/bisection.md.
"""

from .model import (
    BisectResult,
    ConfigStats,
    Element,
    FeasibleFn,
    FlagVerdict,
    GpuCountFn,
    Settings,
    ValueProbe,
    default_cap,
    default_gpu_count,
)
from .pipeline import bisect_flags
from .policy import Policy
from .posterior import exposure_until, p_as_fast

bisect = bisect_flags  # the name the tests and older callers use: the same function

__all__ = [
    "Policy",
    "BisectResult",
    "ConfigStats",
    "Element",
    "FeasibleFn",
    "FlagVerdict",
    "GpuCountFn",
    "Settings",
    "ValueProbe",
    "bisect",
    "bisect_flags",
    "default_cap",
    "default_gpu_count",
    "exposure_until",
    "p_as_fast",
]
