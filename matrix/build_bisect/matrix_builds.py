"""The builds of `soakmatrix bisect --builds` as the matrix's `Build`s, the type a soak job's
runtime_env is made from (`matrix.builds.runtime_env_for`, `build_env`).

`GOOD..BAD` naming two builds of the section is the section from one to the other. A line of the
builds list that is just a name of the matrix's `builds:` section is that build (its
pip, image or python and its setup_timeout); any other line is a build spec of its own
(`specs.BuildSpec`: pip, `image:` or `python:`). A bare word that is neither a build of the section
nor a pinned requirement is refused: it is much likelier a misspelt build name than a wish to bisect
over "the newest release of package X".

A build's ordinal (what a hang model's `when: {build: ORDINAL}` keys on, in the virtual oracle and
in the simulated engine alike) is its ordinal in the matrix's `builds:` for a build of the section,
so a hang model means the same build to `run` and to `bisect`, and its position in the list (0 =
the good build) for a build spec. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from soakmatrix.matrix.spec_types import Build

from .specs import BuildSpec, parse_range

# a pip requirement that says which version: a specifier, a URL, a path or a wheel
_PINNED = re.compile(r"[=<>!~@/\\]|\.whl$|\.tar\.gz$|\.zip$")
_BARE_WORD = re.compile(r"^[A-Za-z0-9_.+-]+$")


def section_range(arg: str, section: Mapping[str, Build]) -> list[BuildSpec] | None:
    """`--builds GOOD..BAD` naming two builds of the matrix's `builds:`: the section from GOOD to BAD
    in its order (as BuildSpecs naming them); None when `arg` is not such a range (a file, commits)."""
    rng = parse_range(arg)
    if rng is None or rng[0] not in section or rng[1] not in section:
        return None
    names = list(section)
    lo, hi = names.index(rng[0]), names.index(rng[1])
    if lo >= hi:
        raise UnknownBuild(f"{arg}: {rng[0]} is not before {rng[1]} in the matrix's builds: ({', '.join(names)})")
    return [BuildSpec(n, n) for n in names[lo : hi + 1]]


class UnknownBuild(ValueError):
    """A builds list naming something that is neither a matrix build nor a build spec (exit 2)."""


def to_builds(specs: Sequence[BuildSpec], section: Mapping[str, Build], matrix_file: str = "the matrix") -> list[Build]:
    """The list's builds, oldest first (see the module docstring for their ordinals)."""
    out: list[Build] = []
    for i, spec in enumerate(specs):
        if "|" in spec.name or "," in spec.name:
            # the build's name is the fifth part of a cell's name, whose parts `|` and `,` separate
            raise UnknownBuild(
                f"build {spec.name!r} (line {i + 1} of the list): a build name holds no `|` or `,`;"
                " name it: `NAME: SPEC`"
            )
        known = section.get(spec.spec) if spec.name == spec.spec else None
        if known is not None:
            out.append(known)
            continue
        if (
            spec.kind == "pip"
            and spec.name == spec.spec
            and _BARE_WORD.match(spec.spec)
            and not _PINNED.search(spec.spec)
        ):
            names = ", ".join(section) if section else "none: it has no `builds:` section"
            raise UnknownBuild(
                f"unknown build {spec.spec!r} (line {i + 1} of the list): not a build of {matrix_file}"
                f" (its builds: {names}), nor a pinned requirement such as vllm==0.6.3; "
                "a build spec of your own is written `NAME: SPEC`"
            )
        value = spec.value.strip()
        if spec.kind == "python" and not value.startswith("/"):
            raise UnknownBuild(
                f"build {spec.name!r}: expected an absolute path to the interpreter on the nodes, got {value!r}"
            )
        out.append(Build(spec.name, i, spec.kind, value, None))
    return out


def describe_build(build: Build) -> str:
    return f"{build.name} ({build.kind}: {build.value})"
