"""A cell: (model, GPU type, flag values, workload[, build]), with a stable short id and a readable name.

The id is a hash of the canonical form, so the same cell keeps its id across runs, machines and
matrix edits that do not touch it; the name `model|gpu|flag=value,...|workload` is unique and is
what JUnit test names, dashboards and `--cell` use. In a matrix with `builds:` the build is part of
both (`...|workload|build`); without one, ids and names are what they always were.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from soakmatrix.matrix.contracts.flags import format_value


@dataclass(frozen=True)
class Cell:
    model: str
    gpu: str
    flags: tuple[tuple[str, Any], ...]  # sorted by flag name
    workload: str
    build: str = ""  # the engine build's name; "" when the matrix has no builds

    @classmethod
    def make(cls, model: str, gpu: str, flags: Mapping[str, Any], workload: str, build: str = "") -> Cell:
        return cls(model, gpu, tuple(sorted(flags.items())), workload, build)

    @property
    def flag_dict(self) -> dict[str, Any]:
        return dict(self.flags)

    def canonical(self) -> str:
        data = {"model": self.model, "gpu": self.gpu, "flags": dict(self.flags), "workload": self.workload}
        if self.build:
            data["build"] = self.build
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @cached_property
    def id(self) -> str:
        return cell_id(self.canonical())

    @cached_property
    def name(self) -> str:
        flags = ",".join(f"{k}={format_value(v)}" for k, v in self.flags)
        name = f"{self.model}|{self.gpu}|{flags}|{self.workload}"
        return f"{name}|{self.build}" if self.build else name

    @property
    def tp(self) -> int:
        return int(dict(self.flags).get("tp", 1))


def cell_id(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def parse_name(name: str) -> tuple[str, str, dict[str, str], str]:
    """Split a cell name into model, GPU, flag strings and workload (values stay strings; a build,
    the fifth part, is left out)."""
    parts = name.split("|")
    if len(parts) not in (4, 5):
        raise ValueError(f"not a cell name (model|gpu|flags|workload[|build]): {name!r}")
    model, gpu, flags, workload = parts[:4]
    pairs = dict(item.split("=", 1) for item in flags.split(",") if item)
    return model, gpu, pairs, workload
