"""A cell: (model, GPU type, flag values, workload), with a stable short id and a readable name.

The id is a hash of the canonical form, so the same cell keeps its id across runs, machines and
matrix edits that do not touch it; the name `model|gpu|flag=value,...|workload` is unique and is
what JUnit test names, dashboards and `--cell` use.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from soakmatrix.matrix.contracts.flags import format_value


@dataclass(frozen=True)
class Cell:
    model: str
    gpu: str
    flags: tuple[tuple[str, Any], ...]   # sorted by flag name
    workload: str

    @classmethod
    def make(cls, model: str, gpu: str, flags: Mapping[str, Any], workload: str) -> "Cell":
        return cls(model, gpu, tuple(sorted(flags.items())), workload)

    @property
    def flag_dict(self) -> dict[str, Any]:
        return dict(self.flags)

    def canonical(self) -> str:
        return json.dumps({"model": self.model, "gpu": self.gpu, "flags": dict(self.flags),
                           "workload": self.workload}, sort_keys=True, separators=(",", ":"))

    @cached_property
    def id(self) -> str:
        return cell_id(self.canonical())

    @cached_property
    def name(self) -> str:
        flags = ",".join(f"{k}={format_value(v)}" for k, v in self.flags)
        return f"{self.model}|{self.gpu}|{flags}|{self.workload}"

    @property
    def tp(self) -> int:
        return int(dict(self.flags).get("tp", 1))


def cell_id(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def parse_name(name: str) -> tuple[str, str, dict[str, str], str]:
    """Split a cell name into model, GPU, flag strings and workload (values stay strings)."""
    parts = name.split("|")
    if len(parts) != 4:
        raise ValueError(f"not a cell name (model|gpu|flags|workload): {name!r}")
    model, gpu, flags, workload = parts
    pairs = dict(item.split("=", 1) for item in flags.split(",") if item)
    return model, gpu, pairs, workload
