"""What a loaded matrix file is: frozen dataclasses for its models, GPU types, profiles, simulator
settings and the matrix itself (`spec.load_matrix` builds them and re-exports every name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .contracts.flags import Flag
from .contracts.workloads import Workload
from .contracts.yamlsrc import Problem, SpecError

# Keys of include/exclude entries that are not flags.
CELL_KEYS = ("model", "gpu", "workload")


@dataclass(frozen=True)
class Model:
    name: str
    path: str
    weights_gb: float = 0.0
    mtp_head: bool = False
    moe: bool = False
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuType:
    name: str
    count: int  # GPUs per node
    memory_gb: float
    ray_label: str  # Ray's accelerator_type label, e.g. H200 or GeForce-RTX-5090


# How a build is installed, each through one field of Ray's runtime_env (matrix/builds.py).
BUILD_KINDS = ("pip", "image", "python")


@dataclass(frozen=True)
class Build:
    """A named engine build of the `builds:` section; its ordinal is its place in the file (history order)."""

    name: str
    ordinal: int
    kind: str  # one of BUILD_KINDS
    value: str  # the pip requirement, the image URI or the interpreter on the nodes
    setup_timeout_s: float | None = None  # Ray's runtime_env setup_timeout_seconds; None: Ray's default


@dataclass(frozen=True)
class Profile:
    name: str
    coverage: int | None  # None: the full product; t: a t-way covering array
    soak_s: float
    workloads: tuple[str, ...]
    budget_gpu_hours: float | None = None
    models: tuple[str, ...] | None = None
    gpus: tuple[str, ...] | None = None
    startup_s: float = 600.0  # expected start-up per cell, counted in GPU-hours
    retries: int = 2  # infra errors retried this many times
    cap_s: float | None = None  # hard cap per cell; default soak + start-up + 10 min
    builds: tuple[str, ...] | None = None  # None: every build of the matrix


@dataclass(frozen=True)
class SimSettings:
    hang_model: str | None = None  # absolute path, or None for a healthy engine
    time_scale: float = 1.0


@dataclass(frozen=True)
class Matrix:
    file: str
    name: str
    models: Mapping[str, Model]
    gpus: Mapping[str, GpuType]
    axes: Mapping[str, tuple[Any, ...]]
    include: tuple[Mapping[str, Any], ...]
    exclude: tuple[Mapping[str, Any], ...]
    workloads: Mapping[str, Workload]
    profiles: Mapping[str, Profile]
    baseline: Mapping[str, Any]
    registry: Mapping[str, Flag]
    sim: SimSettings = field(default_factory=SimSettings)
    source_dependencies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    include_lines: tuple[int, ...] = ()
    key_lines: Mapping[tuple, int] = field(default_factory=dict, compare=False, repr=False)  # key path -> line
    builds: Mapping[str, Build] = field(default_factory=dict)  # in the file's order; empty: no build axis

    def line_of(self, *path: Any) -> int:
        """The line of a key path in the file (the nearest enclosing key's, else 1)."""
        while path:
            if path in self.key_lines:
                return self.key_lines[path]
            path = path[:-1]
        return 1

    def profile(self, name: str | None) -> Profile:
        """The named profile; without a name, the only one or the first."""
        if name is None:
            return next(iter(self.profiles.values()))
        if name not in self.profiles:
            raise SpecError(
                [Problem(self.file, 0, "profiles", f"no profile {name!r}; known: {', '.join(self.profiles) or 'none'}")]
            )
        return self.profiles[name]
