"""The matrix file: a loader that reports every error at once.

A matrix file names models, GPU types, flag axes, include/exclude rules (GitHub Actions semantics),
workloads, profiles, the baseline (each flag's neutral value, used by bisection) and, optionally,
the engine builds every cell runs on (`builds:`, docs/guide/builds.md). `load_matrix`
returns a `Matrix` or raises `SpecError` listing every problem with its file, line and key. The
frozen dataclasses it builds live in `spec_types` and are re-exported here, as are the duration
helpers, so `matrix.spec` stays the one place to import a matrix's names from. The flag sections
(`flags:`, `axes:`, `baseline:`, include/exclude) are read by `spec_flags`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .builds import builds_section
from .contracts import flags as flagmod
from .contracts.durations import format_duration, parse_duration
from .contracts.flags import Flag
from .contracts.hangmodel import load_hang_model
from .contracts.workloads import WORKLOAD_KINDS, Workload, check_param, params_of
from .contracts.yamlsrc import Source, SpecError, load
from .spec_flags import FlagSections
from .spec_types import BUILD_KINDS, CELL_KEYS, Build, GpuType, Matrix, Model, Profile, SimSettings

__all__ = [
    "Model",
    "GpuType",
    "Workload",
    "Profile",
    "SimSettings",
    "Matrix",
    "Build",
    "load_matrix",
    "parse_duration",
    "format_duration",
    "SpecError",
    "CELL_KEYS",
    "BUILD_KINDS",
]

TOP_KEYS = {
    "name",
    "description",
    "models",
    "gpus",
    "axes",
    "include",
    "exclude",
    "workloads",
    "profiles",
    "baseline",
    "flags",
    "sim",
    "source_dependencies",
    "builds",
}
MODEL_KEYS = {"path", "weights_gb", "mtp_head", "moe", "args"}
GPU_KEYS = {"count", "memory_gb", "ray_label"}
PROFILE_KEYS = {
    "coverage",
    "soak",
    "workloads",
    "budget_gpu_hours",
    "models",
    "gpus",
    "startup",
    "retries",
    "cap",
    "builds",
}
SIM_KEYS = {"hang_model", "time_scale"}


def load_matrix(path: str | Path, text: str | None = None, registry: Mapping[str, Flag] | None = None) -> Matrix:
    """Load and validate a matrix file. Raises SpecError with every problem found."""
    src = load(path, text)
    return _Builder(src, dict(flagmod.REGISTRY if registry is None else registry)).build()


class _Builder(FlagSections):
    """Builds a Matrix section by section, recording every problem in the source instead of
    stopping at the first, so one run of `plan` names them all."""

    def __init__(self, src: Source, registry: dict[str, Flag]):
        self.src = src
        self.registry = registry
        # names declared with errors (already reported there): a reference to one is not "unknown"
        self.invalid: dict[str, set[str]] = {"model": set(), "GPU type": set(), "workload": set()}

    def err(self, path: tuple, message: str) -> None:
        self.src.error(path, message)

    def mapping(self, value: Any, path: tuple, allowed: set[str] | None = None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.err(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    self.err(path + (key,), f"unknown key; expected one of {', '.join(sorted(allowed))}")
        return value

    def build(self) -> Matrix:
        src = self.src
        data = src.data
        if data is None:
            data = {}
        top = self.mapping(data, (), TOP_KEYS)
        if not top and not src.problems:
            self.err((), "the matrix file is empty")
        self.custom_flags(top.get("flags"))
        models = self.models(top.get("models"))
        gpus = self.gpus(top.get("gpus"))
        axes = self.axes(top.get("axes"))
        workloads = self.workloads(top.get("workloads"))
        builds = self.builds(top.get("builds"))
        exclude = self.rules(top.get("exclude"), ("exclude",), models, gpus, workloads, axes=axes)
        include = self.rules(top.get("include"), ("include",), models, gpus, workloads)
        profiles = self.profiles(top.get("profiles"), models, gpus, workloads, builds)
        baseline = self.flag_values(top.get("baseline"), ("baseline",))
        sim = self.sim(top.get("sim"), builds)
        deps = self.source_dependencies(top.get("source_dependencies"))
        name = top.get("name", Path(src.file).stem)
        if not isinstance(name, str) or not name.strip():
            self.err(("name",), f"expected a non-empty string, got {name!r}")
        src.raise_if_any()
        include_lines = tuple(src.line(("include", i)) for i in range(len(include)))
        return Matrix(
            file=src.file,
            name=str(name),
            models=models,
            gpus=gpus,
            axes=axes,
            include=include,
            exclude=exclude,
            workloads=workloads,
            profiles=profiles,
            baseline=baseline,
            registry=self.registry,
            sim=sim,
            source_dependencies=deps,
            include_lines=include_lines,
            key_lines=dict(src.lines),
            builds=builds,
        )

    # -- sections ---------------------------------------------------------------------------------

    def models(self, value: Any) -> dict[str, Model]:
        out = {}
        section = self.mapping(value, ("models",))
        if not section:
            self.err(("models",), "at least one model is required")
        for name, spec in section.items():
            path = ("models", name)
            spec = self.mapping(spec, path, MODEL_KEYS)
            model_path = spec.get("path")
            if not isinstance(model_path, str) or not model_path:
                self.err(path + ("path",), "required: the model's path or hub id")
                self.invalid["model"].add(str(name))
                continue
            weights = spec.get("weights_gb")  # left out: unknown, and the memory constraint is skipped
            if weights is not None and (
                isinstance(weights, bool) or not isinstance(weights, (int, float)) or weights <= 0
            ):
                self.err(path + ("weights_gb",), f"expected a number of GB above 0, got {weights!r}")
            if not isinstance(weights, (int, float)) or isinstance(weights, bool) or weights <= 0:
                weights = 0
            bools = {}
            for key in ("mtp_head", "moe"):
                bools[key] = spec.get(key, False)
                if not isinstance(bools[key], bool):
                    self.err(path + (key,), f"expected true or false, got {bools[key]!r}")
            args = spec.get("args", [])
            if isinstance(args, str):
                args = args.split()
            if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
                self.err(path + ("args",), "expected a list of arguments")
                args = []
            out[str(name)] = Model(
                str(name),
                model_path,
                float(weights),
                bool(bools["mtp_head"]),
                bool(bools["moe"]),
                tuple(str(a) for a in args),
            )
        return out

    def gpus(self, value: Any) -> dict[str, GpuType]:
        out = {}
        section = self.mapping(value, ("gpus",))
        if not section:
            self.err(("gpus",), "at least one GPU type is required")
        for name, spec in section.items():
            path = ("gpus", name)
            spec = self.mapping(spec, path, GPU_KEYS)
            # every problem of the entry is reported, not only the first
            count = spec.get("count")
            ok = True
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                self.err(path + ("count",), f"required: GPUs per node, an integer >= 1 (got {count!r})")
                ok = False
            memory = spec.get("memory_gb")
            if isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0:
                self.err(path + ("memory_gb",), f"required: memory per GPU in GB, > 0 (got {memory!r})")
                ok = False
            label = spec.get("ray_label", str(name))
            if not isinstance(label, str) or not label:
                self.err(path + ("ray_label",), "expected a non-empty string")
                ok = False
            if ok:
                assert isinstance(count, int) and isinstance(memory, (int, float))  # checked above
                out[str(name)] = GpuType(str(name), count, float(memory), label)
            else:
                self.invalid["GPU type"].add(str(name))
        return out

    def known(self, value: Any, known: Mapping, path: tuple, what: str) -> bool:
        if value not in known and str(value) in self.invalid.get(what, ()):
            return False
        if value not in known:
            self.err(path, f"unknown {what} {value!r}; known: {', '.join(map(str, known)) or 'none'}")
            return False
        return True

    def workloads(self, value: Any) -> dict[str, Workload]:
        out = {}
        section = self.mapping(value, ("workloads",))
        if not section:
            # a matrix without workloads soaks with the default random load
            return {"random": Workload("random", "random", {k: d for k, (_, d) in params_of("random").items()})}
        for name, spec in section.items():
            path = ("workloads", name)
            spec = self.mapping(spec, path)
            kind = spec.get("kind", name if name in WORKLOAD_KINDS else None)
            if kind not in WORKLOAD_KINDS:
                self.err(path + ("kind",), f"unknown workload kind {kind!r}; known: {', '.join(WORKLOAD_KINDS)}")
                self.invalid["workload"].add(str(name))
                continue
            schema = params_of(kind)
            params = {k: d for k, (_, d) in schema.items()}
            ok = True
            for key, v in spec.items():
                if key == "kind":
                    continue
                if key not in schema:
                    self.err(path + (key,), f"unknown parameter for a {kind} workload; known: {', '.join(schema)}")
                    ok = False
                    continue
                problem = check_param(schema[key][0], v)
                if problem:
                    self.err(path + (key,), problem)
                    ok = False
                params[key] = v
            if ok:
                out[str(name)] = Workload(str(name), kind, params)
            else:
                self.invalid["workload"].add(str(name))
        return out

    def builds(self, value: Any) -> dict[str, Build]:
        return builds_section(value, self.err, self.mapping, self.duration)

    def names(self, value: Any, known: Mapping, path: tuple, what: str) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            self.err(path, f"expected a non-empty list of {what} names")
            return None
        return tuple(v for i, v in enumerate(value) if self.known(v, known, path + (i,), what))

    def profiles(
        self, value: Any, models: Mapping, gpus: Mapping, workloads: Mapping, builds: Mapping | None = None
    ) -> dict[str, Profile]:
        out = {}
        if value == {}:
            self.err(("profiles",), "empty: leave `profiles` out for one default profile, or name one")
        section = self.mapping(value, ("profiles",))
        if not section:
            section = {"default": {}}
        for name, spec in section.items():
            path = ("profiles", name)
            spec = self.mapping(spec, path, PROFILE_KEYS)
            coverage = self.coverage(spec.get("coverage", "full"), path + ("coverage",))
            soak = self.duration(spec.get("soak", "10m"), path + ("soak",), positive=True)
            startup = self.duration(spec.get("startup", "10m"), path + ("startup",))
            cap = self.duration(spec["cap"], path + ("cap",), positive=True) if "cap" in spec else None
            wl = self.names(spec.get("workloads"), workloads, path + ("workloads",), "workload")
            budget = spec.get("budget_gpu_hours")
            if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
                self.err(path + ("budget_gpu_hours",), f"expected a positive number, got {budget!r}")
                budget = None
            retries = spec.get("retries", 2)
            if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
                self.err(path + ("retries",), f"expected a non-negative integer, got {retries!r}")
                retries = 2
            out[str(name)] = Profile(
                name=str(name),
                coverage=coverage,
                soak_s=soak,
                workloads=wl or tuple(workloads)[:1],
                budget_gpu_hours=float(budget) if budget is not None else None,
                models=self.names(spec.get("models"), models, path + ("models",), "model"),
                gpus=self.names(spec.get("gpus"), gpus, path + ("gpus",), "GPU type"),
                startup_s=startup,
                retries=retries,
                cap_s=cap,
                builds=self.names(spec.get("builds"), builds or {}, path + ("builds",), "build"),
            )
        return out

    def coverage(self, value: Any, path: tuple) -> int | None:
        if value == "full":
            return None
        if isinstance(value, dict) and set(value) == {"t"}:
            value = value["t"]
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 6:
            return value
        self.err(path, f"expected `full` or a t-way strength like {{t: 2}} (1-6), got {value!r}")
        return None

    def duration(self, value: Any, path: tuple, positive: bool = False) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.err(path, str(exc))
            return 0.0
        if positive and seconds <= 0:
            self.err(path, f"must be longer than 0, got {value!r}")
        return seconds

    def sim(self, value: Any, builds: Mapping[str, Build] | None = None) -> SimSettings:
        spec = self.mapping(value, ("sim",), SIM_KEYS)
        hang_model = spec.get("hang_model")
        if hang_model is not None:
            if not isinstance(hang_model, str):
                self.err(("sim", "hang_model"), "expected a path")
                hang_model = None
            else:
                resolved = (Path(self.src.file).parent / hang_model).resolve()
                if not resolved.is_file():
                    self.err(("sim", "hang_model"), f"no such file: {resolved}")
                else:
                    self.hang_model_problems(resolved, tuple(builds or ()))
                hang_model = str(resolved)
        scale = spec.get("time_scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
            self.err(("sim", "time_scale"), f"expected a positive number, got {scale!r}")
            scale = 1.0
        return SimSettings(hang_model, float(scale))

    def hang_model_problems(self, path: Path, builds: tuple[str, ...] = ()) -> None:
        """A broken hang model is the matrix's problem too: found at `plan`, not as every cell's
        config_error. Its problems are reported with its own file and lines (a `when: {build: ...}`
        must name a build of this matrix)."""
        try:
            load_hang_model(path, registry=self.registry, builds=builds)
        except SpecError as exc:
            self.src.problems.extend(exc.problems)

    def source_dependencies(self, value: Any) -> dict[str, tuple[str, ...]]:
        out = {}
        for pattern, names in self.mapping(value, ("source_dependencies",)).items():
            path = ("source_dependencies", pattern)
            if isinstance(names, str):
                names = [names]
            if not isinstance(names, list):
                self.err(path, "expected a list of flag names")
                continue
            good = []
            for i, name in enumerate(names):
                if name not in self.registry:
                    self.err(path + (i,), f"unknown flag {name!r}")
                else:
                    good.append(name)
            out[str(pattern)] = tuple(good)
        return out
