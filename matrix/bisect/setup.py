"""Setting up a bisection from a matrix: the failing cell, its elements and context against the
baseline, the values to try once the set is known, which configs can run, and the probe oracle.

An element is a flag whose failing-cell value differs from the matrix baseline; one whose baseline
value breaks a constraint cannot move and is context instead, with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from soakmatrix.matrix.constraints import violations
from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec import Matrix, Profile

from .model import Element, FeasibleFn

if TYPE_CHECKING:
    from soakmatrix.matrix.schedule.cluster import ClusterHandle

    from .oracle_soak import SoakOracle
    from .oracle_virtual import VirtualOracle


def find_cell(cells: list[PlannedCell], key: str, matrix: Matrix) -> PlannedCell:
    """The planned cell whose id or name is `key`, or whose id alone starts with it (4+ characters)."""
    for pc in cells:
        if key in (pc.id, pc.name):
            return pc
    matches = [pc for pc in cells if pc.id.startswith(key)] if len(key) >= 4 else []
    if len(matches) == 1:
        return matches[0]
    raise LookupError(f"{matrix.file}: no cell {key!r} in the plan"
                      + (f" ({len(matches)} ids start with it)" if matches else "")
                      + "; `soakmatrix plan` lists ids and names")


def combo_of(pc: PlannedCell, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"model": pc.cell.model, "gpu": pc.cell.gpu, "workload": pc.cell.workload,
            **(pc.cell.flag_dict if flags is None else flags)}


def elements_of(pc: PlannedCell, matrix: Matrix) -> tuple[list[Element], list[Element], dict[str, str]]:
    """Movable elements, context elements and why each context flag cannot move."""
    flags = pc.cell.flag_dict
    movable, fixed, why = [], [], {}
    for name, value in flags.items():
        if name not in matrix.baseline:
            continue
        base = matrix.baseline[name]
        if value == base and isinstance(value, bool) == isinstance(base, bool):
            continue
        element = Element(name, value, base)
        reasons = violations(combo_of(pc, {**flags, name: base}), matrix)
        if reasons:
            fixed.append(element)
            why[name] = "; ".join(reasons)
        else:
            movable.append(element)
    return movable, fixed, why


def alternatives_of(elements: list[Element], matrix: Matrix) -> dict[str, list[Any]]:
    """Values to try once the set is known, from the failing value toward the baseline:
    integers halve (TP 8 -> 4 -> 2), choices try every other choice."""
    out: dict[str, list[Any]] = {}
    for e in elements:
        flag = matrix.registry.get(e.name)
        if flag is None or flag.kind == "bool":
            continue
        if flag.kind == "int" and isinstance(e.value, int) and isinstance(e.baseline, int):
            values, v = [], e.value
            while True:
                v = v // 2 if e.value > e.baseline else v * 2
                if (e.value > e.baseline and v <= e.baseline) or (e.value < e.baseline and v >= e.baseline) or v in values:
                    break
                values.append(v)
            if values:
                out[e.name] = values
        elif flag.choices:
            others = [c for c in flag.choices if c not in (e.value, e.baseline)]
            if others:
                out[e.name] = others
    return out


def feasibility(pc: PlannedCell, matrix: Matrix) -> FeasibleFn:
    """Why a flag dict on the failing cell's model, GPU and workload cannot run (the matrix's
    constraints), or None."""
    def feasible(flags: Mapping[str, Any]) -> str | None:
        reasons = violations(combo_of(pc, flags), matrix)
        return "; ".join(reasons) if reasons else None

    return feasible


def virtual_oracle(matrix: Matrix, pc: PlannedCell, profile: Profile, hang_model_path: str,
                   seed: int | None) -> VirtualOracle:
    """Virtual time: hangs drawn from the hang model for the failing cell's GPU and workload."""
    from soakmatrix.matrix.contracts.hangmodel import load_hang_model

    from .oracle_virtual import VirtualOracle

    model = load_hang_model(hang_model_path, registry=matrix.registry)
    concurrency = matrix.workloads[pc.cell.workload].params.get("concurrency")
    return VirtualOracle(model, pc.cell.gpu, startup_s=profile.startup_s, seed=seed,
                         concurrency=concurrency if isinstance(concurrency, int) else None,
                         registry=matrix.registry)


def soak_oracle(matrix: Matrix, pc: PlannedCell, profile: Profile, *, backend: str, ray_address: str | None,
                out_dir: str) -> tuple[SoakOracle, ClusterHandle]:
    """Soak jobs on Ray: connects (or starts a local cluster); the caller closes the handle."""
    from soakmatrix.matrix.schedule.cluster import address_from, connect

    from .oracle_soak import SoakOracle

    cluster = connect(address_from(ray_address), backend=backend, gpus=matrix.gpus)
    return SoakOracle(matrix, profile, pc.cell.model, pc.cell.gpu, pc.cell.workload,
                      backend=backend, out_dir=out_dir), cluster
