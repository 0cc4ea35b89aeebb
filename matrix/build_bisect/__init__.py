"""Build bisection: which build of an ordered list brought the hang in.

Pure: `bisect_builds(builds, oracle, settings)` (algorithm.py) over a posterior on the change point
per signature (posterior.py, signatures.py: a clean regression or a rate change; tuning.py) with
probes chosen for information per GPU-hour (planner.py); the oracle is injected
(oracle.py; oracle_virtual.py draws virtual times). `run_build_bisection` (run.py) is what the CLI
calls, with builds from a file or a commit range (specs.py), and `render_text` / `to_json`
(report.py) print the answer. bound.py is the floor any procedure must pay, bound_rate.py the
same for a rate change. docs/design/build-bisection-algorithm.md.
"""

from .algorithm import BuildSettings, bisect_builds
from .bound import BuildBound, lower_bound
from .oracle import HANG, PASSED, UNTESTABLE, BuildOracle, BuildProbe, BuildProbeResult, FlagOracleAdapter
from .oracle_virtual import VirtualBuildOracle
from .report import render_text, to_json
from .result import (
    BAD_UNTESTABLE,
    FOUND,
    INCONCLUSIVE,
    NOT_A_REGRESSION,
    NOT_REPRODUCED,
    RANGE,
    RATE_CHANGE,
    BuildBisectResult,
)
from .run import run_build_bisection
from .signatures import SignatureAnswer
from .specs import (
    BuildSpec,
    BuildSpecError,
    builds_from_range,
    git_rev_list,
    parse_builds_file,
    parse_builds_text,
    parse_range,
    resolve_builds,
)
from .tuning import Tuning

__all__ = [
    "BAD_UNTESTABLE",
    "FOUND",
    "INCONCLUSIVE",
    "NOT_A_REGRESSION",
    "NOT_REPRODUCED",
    "RANGE",
    "RATE_CHANGE",
    "HANG",
    "PASSED",
    "UNTESTABLE",
    "BuildBisectResult",
    "BuildSettings",
    "bisect_builds",
    "BuildBound",
    "lower_bound",
    "BuildOracle",
    "BuildProbe",
    "BuildProbeResult",
    "FlagOracleAdapter",
    "VirtualBuildOracle",
    "render_text",
    "to_json",
    "run_build_bisection",
    "BuildSpec",
    "BuildSpecError",
    "builds_from_range",
    "git_rev_list",
    "parse_builds_file",
    "parse_builds_text",
    "parse_range",
    "resolve_builds",
    "SignatureAnswer",
    "Tuning",
]
