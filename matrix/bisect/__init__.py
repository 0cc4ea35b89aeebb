"""Flag bisection for intermittent hangs: the smallest set of flags that still hangs, with confidence.

The algorithm is pure: the probe oracle (oracle.py) is passed in; no clocks, processes or Ray in
it. `bisect(...)` (bisection.py) calibrates on the failing cell, searches, checks the rate,
certifies the set and writes the verdicts, from these parts:

- model.py: elements, settings, what was seen on each config, the result and its verdict types;
- posterior.py: the posterior over which set of flags is the trigger, and the pooled-rate tests;
- search.py: the state every stage shares, calibration, and the posterior search over every set;
- ablation.py: the failing cell without each flag in turn, tried before the posterior search;
- ratecheck.py: whether the set is enough to hang within the cap, or needs one flag more;
- verdicts.py: other values of the set's flags, and a verdict per flag.

A second, independent trigger (an OR of conjunctions) shows as hangs in configs without the answer:
the search still converges on one minimal set and the result says others may exist.

Around the algorithm: setup.py (a bisection from a matrix cell), emit.py (the `--emit-test`
regression test), report.py (text and JSON), bound.py (the least cost of any bisection), and the two
oracles, oracle_virtual.py and oracle_soak.py.
"""

from .model import (
    MAX_ELEMENTS,
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
from .posterior import exposure_until, p_as_fast
from .pipeline import bisect_flags
from .policy import Policy

bisect = bisect_flags     # the name the tests and older callers use: the same function

__all__ = [
    "MAX_ELEMENTS", "Policy", "BisectResult", "ConfigStats", "Element", "FeasibleFn", "FlagVerdict",
    "GpuCountFn", "Settings", "ValueProbe", "bisect", "bisect_flags", "default_cap", "default_gpu_count", "exposure_until",
    "p_as_fast",
]
