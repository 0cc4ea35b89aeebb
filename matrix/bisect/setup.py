"""Setting up a bisection from a matrix: the failing cell, its elements and context against the
baseline, the values to try once the set is known, which configs can run, and the probe oracle.

An element is a flag whose failing-cell value differs from the matrix baseline; one whose baseline
value breaks a constraint cannot move and is context instead, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from soakmatrix.matrix.constraints import violations
from soakmatrix.matrix.contracts.yamlsrc import Problem, SpecError
from soakmatrix.matrix.plan import PlannedCell
from soakmatrix.matrix.spec import Matrix, Profile

from .history_exposure import HistoryExposure, history_exposure
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
    raise LookupError(
        f"{matrix.file}: no cell {key!r} in the plan"
        + (f" ({len(matches)} ids start with it)" if matches else "")
        + "; `soakmatrix plan` lists ids and names"
    )


def combo_of(pc: PlannedCell, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": pc.cell.model,
        "gpu": pc.cell.gpu,
        "workload": pc.cell.workload,
        **(pc.cell.flag_dict if flags is None else flags),
    }


def elements_of(pc: PlannedCell, matrix: Matrix) -> tuple[list[Element], list[Element], dict[str, str]]:
    """Movable elements, context elements and why each context flag cannot move.

    Every flag of the cell is accounted for. One the baseline does not name has no value to move
    to: it is context when no other value of it (the matrix's axis, vLLM's default) can run with
    this cell, and otherwise a configuration error naming the key (SpecError, exit 2): dropping it
    silently would bisect a different question than the user asked."""
    flags = pc.cell.flag_dict
    movable, fixed, why = [], [], {}
    problems: list[Problem] = []
    for name, value in flags.items():
        if name not in matrix.baseline:
            others = _other_values(matrix, name, value)
            runnable = [v for v in others if not violations(combo_of(pc, {**flags, name: v}), matrix)]
            if runnable:
                problems.append(
                    Problem(
                        matrix.file,
                        matrix.line_of("baseline"),
                        f"baseline.{name}",
                        f"the cell {pc.name} sets {name}={value!r} but the baseline has no value "
                        f"for it, so bisection cannot tell whether it matters: add `{name}: <its "
                        f"neutral value>` to baseline (e.g. {runnable[0]!r})",
                    )
                )
            else:
                fixed.append(Element(name, value, value))
                why[name] = (
                    "not in baseline, and no other value of it can run with this cell"
                    if others
                    else "not in baseline, and it has no other value"
                )
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
    if problems:
        raise SpecError(problems)
    return movable, fixed, why


def _other_values(matrix: Matrix, name: str, value: Any) -> list[Any]:
    """Values a flag missing from the baseline could move to: its axis values, then vLLM's default."""
    flag = matrix.registry.get(name)
    candidates = list(matrix.axes.get(name, ())) + (
        [flag.default] if flag is not None and flag.default is not None else []
    )
    out: list[Any] = []
    for v in candidates:
        same = v == value and isinstance(v, bool) == isinstance(value, bool)
        if not same and v not in out:
            out.append(v)
    return out


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
                if (
                    (e.value > e.baseline and v <= e.baseline)
                    or (e.value < e.baseline and v >= e.baseline)
                    or v in values
                ):
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


def virtual_oracle(
    matrix: Matrix, pc: PlannedCell, profile: Profile, hang_model_path: str, seed: int | None
) -> VirtualOracle:
    """Virtual time: hangs drawn from the hang model for the failing cell's GPU, workload and build."""
    from soakmatrix.matrix.contracts.hangmodel import load_hang_model

    from .oracle_virtual import VirtualOracle

    model = load_hang_model(hang_model_path, registry=matrix.registry)
    concurrency = matrix.workloads[pc.cell.workload].params.get("concurrency")
    return VirtualOracle(
        model,
        pc.cell.gpu,
        startup_s=profile.startup_s,
        seed=seed,
        concurrency=concurrency if isinstance(concurrency, int) else None,
        registry=matrix.registry,
        build=(pc.build.ordinal, pc.build.name) if pc.build is not None else None,
    )


def soak_oracle(
    matrix: Matrix,
    pc: PlannedCell,
    profile: Profile,
    *,
    backend: str,
    ray_address: str | None,
    out_dir: str,
    seed: int | None = None,
) -> tuple[SoakOracle, ClusterHandle]:
    """Soak jobs on Ray: connects (or starts a local cluster); the caller closes the handle."""
    from soakmatrix.matrix.schedule.cluster import address_from, connect
    from soakmatrix.matrix.stop_signals import reinstall_active

    from .oracle_soak import SoakOracle

    cluster = connect(address_from(ray_address), backend=backend, gpus=matrix.gpus)
    reinstall_active()  # ray.init put its own SIGINT/SIGTERM handlers in: ours stop the probes cleanly
    return SoakOracle(
        matrix,
        profile,
        pc.cell.model,
        pc.cell.gpu,
        pc.cell.workload,
        backend=backend,
        out_dir=out_dir,
        seed=seed,
        build=pc.build,
    ), cluster


def recorded_signature(store: Any, cell_id: str) -> tuple[str | None, str]:
    """The signature the history store last recorded for this cell: its newest hang's, else its
    newest crash's (a cell reported as a hang is never bisected for a crash), with where it came from."""
    hangs = [
        o for o in store.observations() if o.cell_id == cell_id and o.signature and o.outcome.value in ("hang", "crash")
    ]
    for wanted in ("hang", "crash"):
        found = [o for o in hangs if o.outcome.value == wanted]
        if found:
            return found[-1].signature, f"the history store (run {found[-1].run_id}, {wanted})"
    return None, ""


def recorded_exposure(store: Any, cell_id: str, signature: str | None) -> HistoryExposure | None:
    """The failing cell's recorded hangs of `signature` and load (same cell id, so same build): free
    exposure for its calibration; None when the store holds no load of it."""
    return history_exposure(store.observations(), cell_id, signature)


def model_signature(matrix: Matrix, pc: PlannedCell, hang_model_path: str) -> tuple[str | None, str]:
    """The signature of the hang the hang model plants in this cell (crashes left out); None when it
    plants none or several (then the calibration's first hang decides)."""
    from soakmatrix.matrix.contracts import flags as flagmod
    from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_hang_model

    model = load_hang_model(hang_model_path, registry=matrix.registry)
    concurrency = matrix.workloads[pc.cell.workload].params.get("concurrency")
    full = flagmod.resolve_defaults(pc.cell.flag_dict, matrix.registry)
    build = (pc.build.ordinal, pc.build.name) if pc.build is not None else None
    styles = {
        h.style
        for h in model.hangs
        if h.style != "crash"
        and h.matches(full, pc.cell.gpu, build)
        and not (isinstance(concurrency, int) and h.min_running > concurrency)
    }
    if len(styles) == 1:
        return STYLE_SIGNATURE[styles.pop()], "the hang model"
    return None, ""
