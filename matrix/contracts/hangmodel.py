"""The hang-model file (docs/reference/hang-model.md): which flag combinations hang, how, and how often.

The simulated engine, the vLLM fault-injection plugin and bisection's virtual-time oracle all read
it through this module, so they agree on what "matches" and on the effective MTTF.

Besides flags, a hang's `when` may name `build`: a build of the matrix's `builds:` section by its
name or its ordinal (0 for the first), or a list of them, so a simulated engine can carry a
regression from one build on. An engine that does not know its build never matches such a hang,
as a flag it lacks never matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import flags as flagmod
from .flags import Flag
from .yamlsrc import Source, load

BUILD_KEY = "build"  # the one `when` key that is not a flag

# An engine's build: (ordinal in the matrix's `builds:`, name).
BuildId = tuple[int, str]

STYLES = ("silent_stall", "event_sync_stall", "shm_broadcast", "crash")

# The signature a soak job's classifier gives each style (jobs/signatures.py names them).
STYLE_SIGNATURE = {
    "silent_stall": "silent_stall",
    "event_sync_stall": "event_sync_stall",
    "shm_broadcast": "shm_broadcast_timeout",
    "crash": "crash",
}


@dataclass(frozen=True)
class Modifier:
    when: Mapping[str, tuple[Any, ...]]
    mttf_factor: float


@dataclass(frozen=True)
class Hang:
    id: str
    style: str
    when: Mapping[str, tuple[Any, ...]]  # flag -> accepted values (any of)
    mttf_s: float
    gpu: tuple[str, ...] | None = None
    min_running: int = 1
    modifiers: tuple[Modifier, ...] = ()
    builds: tuple[int | str, ...] | None = None  # `when: {build: ...}`: ordinals and names; None: any build

    def matches(self, flags: Mapping[str, Any], gpu: str | None = None, build: BuildId | None = None) -> bool:
        """True when every `when` key matches the engine's (default-filled) flags, the GPU and the build."""
        if self.gpu is not None and gpu not in self.gpu:
            return False
        if not self.matches_build(build):
            return False
        return _when_matches(self.when, flags)

    def matches_build(self, build: BuildId | None) -> bool:
        if self.builds is None:
            return True
        if build is None:
            return False
        ordinal, name = build
        return any((isinstance(b, int) and b == ordinal) or (isinstance(b, str) and b == name) for b in self.builds)

    def effective_mttf_s(self, flags: Mapping[str, Any]) -> float:
        """MTTF under these flags: the base MTTF times every matching modifier's factor."""
        mttf = self.mttf_s
        for mod in self.modifiers:
            if _when_matches(mod.when, flags):
                mttf *= mod.mttf_factor
        return mttf


def _when_matches(when: Mapping[str, tuple[Any, ...]], flags: Mapping[str, Any]) -> bool:
    for key, accepted in when.items():
        if key not in flags:
            return False
        value = flags[key]
        if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted):
            return False
    return True


@dataclass(frozen=True)
class HangModel:
    seed: int
    hangs: tuple[Hang, ...]
    file: str = ""

    def active(
        self,
        flags: Mapping[str, Any],
        gpu: str | None = None,
        registry: Mapping[str, Flag] | None = None,
        build: BuildId | None = None,
    ) -> list[Hang]:
        """The hangs that can fire for an engine with these flags (defaults filled in) on this GPU and build."""
        full = flagmod.resolve_defaults(flags, registry)
        return [h for h in self.hangs if h.matches(full, gpu, build)]


EMPTY = HangModel(seed=0, hangs=())

HANG_KEYS = {"id", "style", "when", "gpu", "min_running", "mttf_s", "modifiers"}


def load_hang_model(
    path: str | Path,
    text: str | None = None,
    registry: Mapping[str, Flag] | None = None,
    builds: Sequence[str] | None = None,
) -> HangModel:
    """Load and validate a hang-model file; every problem is reported at once (SpecError).

    With `builds` (the matrix's build names, in order), a `when: {build: ...}` must name one of them
    or an ordinal below their count; without, any name and ordinal is accepted."""
    src = load(path, text)
    registry = flagmod.REGISTRY if registry is None else registry
    data = src.data if src.data is not None else {}
    if not isinstance(data, dict):
        src.error((), "expected a mapping with `seed` and `hangs`")
        src.raise_if_any()
    for key in data:
        if key not in ("seed", "hangs"):
            src.error((key,), "unknown key; expected seed, hangs")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        src.error(("seed",), f"expected an integer, got {seed!r}")
        seed = 0
    raw = data.get("hangs", [])
    if not isinstance(raw, list):
        src.error(("hangs",), "expected a list")
        raw = []
    hangs = []
    ids: set[str] = set()
    for i, entry in enumerate(raw):
        hang = _hang(src, ("hangs", i), entry, registry, builds)
        if hang is not None:
            if hang.id in ids:
                src.error(("hangs", i, "id"), f"duplicate id {hang.id!r}")
            ids.add(hang.id)
            hangs.append(hang)
    src.raise_if_any()
    return HangModel(seed=seed, hangs=tuple(hangs), file=str(path))


def _number(src: Source, path: tuple, value: Any, positive: bool = True) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        src.error(path, f"expected a positive number, got {value!r}")
        return None
    return float(value)


def _builds(src: Source, path: tuple, value: Any, builds: Sequence[str] | None) -> tuple[int | str, ...] | None:
    """`when: {build: ...}`: a build name, an ordinal, or a list of them."""
    values = value if isinstance(value, list) else [value]
    if not values:
        src.error(path, "an empty list matches nothing")
        return None
    ok = True
    for j, v in enumerate(values):
        vpath = path + ((j,) if isinstance(value, list) else ())
        if isinstance(v, bool) or not isinstance(v, (int, str)) or v == "" or (isinstance(v, int) and v < 0):
            src.error(vpath, f"expected a build name or ordinal (0 for the first build), got {v!r}")
            ok = False
        elif builds is not None and isinstance(v, int) and v >= len(builds):
            src.error(
                vpath,
                f"build ordinal {v} is past the last build ({len(builds) - 1})"
                if builds
                else "the matrix has no `builds:` section",
            )
            ok = False
        elif builds is not None and isinstance(v, str) and v not in builds:
            src.error(vpath, f"unknown build {v!r}; known: {', '.join(builds) or 'none (no `builds:` section)'}")
            ok = False
    return tuple(values) if ok else None


def _when(
    src: Source,
    path: tuple,
    value: Any,
    registry: Mapping[str, Flag],
    builds: Sequence[str] | None = None,
    build_key: bool = False,
) -> dict[str, tuple] | None:
    """Flag -> accepted values; with `build_key`, a `build` entry is kept under BUILD_KEY for the caller."""
    if not isinstance(value, dict):
        src.error(path, "expected a mapping of flag -> value or list of values")
        return None
    out: dict[str, tuple] = {}
    ok = True
    for key, accepted in value.items():
        if key == BUILD_KEY and key not in registry:
            if not build_key:
                src.error(path + (key,), "`build` belongs in the hang's own `when`, not a modifier's")
                ok = False
                continue
            chosen = _builds(src, path + (key,), accepted, builds)
            if chosen is None:
                ok = False
            else:
                out[key] = chosen
            continue
        flag = registry.get(key)
        if flag is None:
            src.error(path + (key,), f"unknown flag {key!r}; known: {', '.join(registry)}")
            ok = False
            continue
        values = accepted if isinstance(accepted, list) else [accepted]
        if not values:
            src.error(path + (key,), "an empty list matches nothing")
            ok = False
        for j, v in enumerate(values):
            problem = flag.check(v)
            if problem:
                src.error(path + (key,) + ((j,) if isinstance(accepted, list) else ()), problem)
                ok = False
        out[key] = tuple(values)
    return out if ok else None


def _hang(
    src: Source, path: tuple, entry: Any, registry: Mapping[str, Flag], builds: Sequence[str] | None = None
) -> Hang | None:
    if not isinstance(entry, dict):
        src.error(path, "expected a mapping")
        return None
    for key in entry:
        if key not in HANG_KEYS:
            src.error(path + (key,), f"unknown key; expected one of {', '.join(sorted(HANG_KEYS))}")
    hang_id = entry.get("id")
    if not isinstance(hang_id, str) or not hang_id:
        src.error(path + ("id",), "required: a name for this hang")
    style = entry.get("style")
    if style not in STYLES:
        src.error(path + ("style",), f"{style!r} is not one of {', '.join(STYLES)}")
    when = _when(src, path + ("when",), entry.get("when", {}), registry, builds, build_key=True)
    chosen_builds = when.pop(BUILD_KEY, None) if when is not None and BUILD_KEY not in registry else None
    mttf = _number(src, path + ("mttf_s",), entry.get("mttf_s"))
    gpu = entry.get("gpu")
    if gpu is not None:
        gpu = gpu if isinstance(gpu, list) else [gpu]
        if not gpu:
            # an empty list would match no GPU (the hang never fires), or read as "every GPU"
            src.error(path + ("gpu",), "an empty list matches no GPU; leave `gpu` out to match every GPU type")
            gpu = None
        elif not all(isinstance(g, str) and g for g in gpu):
            src.error(path + ("gpu",), "expected a GPU type or a list of them")
            gpu = None
    min_running = entry.get("min_running", 1)
    if isinstance(min_running, bool) or not isinstance(min_running, int) or min_running < 0:
        src.error(path + ("min_running",), f"expected a non-negative integer, got {min_running!r}")
        min_running = 1
    modifiers = []
    raw_mods = entry.get("modifiers", [])
    if not isinstance(raw_mods, list):
        src.error(path + ("modifiers",), "expected a list")
        raw_mods = []
    for j, mod in enumerate(raw_mods):
        mpath = path + ("modifiers", j)
        if not isinstance(mod, dict):
            src.error(mpath, "expected a mapping with `when` and `mttf_factor`")
            continue
        for key in mod:
            if key not in ("when", "mttf_factor"):
                src.error(mpath + (key,), "unknown key; expected when, mttf_factor")
        mwhen = _when(src, mpath + ("when",), mod.get("when", {}), registry)
        factor = _number(src, mpath + ("mttf_factor",), mod.get("mttf_factor"))
        if mwhen is not None and factor is not None:
            modifiers.append(Modifier(mwhen, factor))
    if when is None or mttf is None or not isinstance(hang_id, str) or style not in STYLES:
        return None
    return Hang(
        id=hang_id,
        style=style,
        when=when,
        mttf_s=mttf,
        gpu=tuple(gpu) if gpu else None,
        min_running=min_running,
        modifiers=tuple(modifiers),
        builds=chosen_builds,
    )


def load_or_empty(path: str | Path | None) -> HangModel:
    return EMPTY if not path else load_hang_model(path)
