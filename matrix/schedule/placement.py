"""Placement on a Ray cluster: which node can host a cell, in which order cells go out, where a
retry must not go. Pure functions over plain data (`Node`, `PlannedCell`), no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from soakmatrix.matrix.plan import PlannedCell

ACCELERATOR_PREFIX = "accelerator_type:"
NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class Node:
    """What placement needs to know about one Ray node."""

    node_id: str
    gpus: float
    accelerators: frozenset[str]  # accelerator_type labels it offers
    alive: bool = True


def nodes_from_ray(ray_nodes: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Turn `ray.nodes()` into `Node`s (dead nodes kept, marked)."""
    out = []
    for n in ray_nodes:
        resources = n.get("Resources") or {}
        labels = frozenset(k[len(ACCELERATOR_PREFIX) :] for k in resources if k.startswith(ACCELERATOR_PREFIX))
        out.append(Node(str(n.get("NodeID", "")), float(resources.get("GPU", 0)), labels, bool(n.get("Alive", True))))
    return out


def placement_problem(pc: PlannedCell, nodes: Sequence[Node]) -> str | None:
    """Why no live node can ever host this cell, or None if one can."""
    live = [n for n in nodes if n.alive]
    typed = [n for n in live if pc.ray_label in n.accelerators]
    if not typed:
        offered = sorted({a for n in live for a in n.accelerators})
        return (
            f"no node offers accelerator_type:{pc.ray_label} ({pc.cell.gpu}); "
            f"the cluster offers: {', '.join(offered) or 'no labelled GPUs'}"
        )
    if not any(n.gpus >= pc.gpu_count for n in typed):
        most = max(n.gpus for n in typed)
        return f"needs {pc.gpu_count} {pc.ray_label} GPUs on one node; the largest such node has {most:g}"
    return None


def unplaceable(cells: Sequence[PlannedCell], nodes: Sequence[Node]) -> dict[str, str]:
    """cell id -> why no node can host it: reported up front instead of pending forever."""
    return {pc.id: reason for pc in cells if (reason := placement_problem(pc, nodes))}


def dispatch_order(cells: Sequence[PlannedCell]) -> list[PlannedCell]:
    """Largest first (GPUs per cell, then GPU-hours): big cells packed early leave the small ones
    to fill the gaps at the end, which keeps the makespan near its lower bound (LPT)."""
    return sorted(cells, key=lambda pc: (-pc.gpu_count, -pc.gpu_hours))


def avoid_on_retry(pc: PlannedCell, failed_on: Iterable[str], nodes: Sequence[Node]) -> frozenset[str]:
    """Nodes a retry must not use: those the cell failed on, as long as another live node can
    still host it (with the only suitable node excluded the retry would wait forever)."""
    failed = frozenset(n for n in failed_on if n)
    hosts = [n for n in nodes if n.alive and pc.ray_label in n.accelerators and n.gpus >= pc.gpu_count]
    if any(n.node_id not in failed for n in hosts):
        return frozenset(n.node_id for n in hosts if n.node_id in failed)
    return frozenset()


def avoid_selector(avoid: Iterable[str]) -> dict[str, str]:
    """Ray's label selector for "not on these nodes" (every node carries its id as a label)."""
    ids = sorted(avoid)
    if not ids:
        return {}
    return {NODE_ID_LABEL: "!" + ids[0] if len(ids) == 1 else "!in(" + ",".join(ids) + ")"}


def stranded(waiting: Sequence[PlannedCell], nodes: Sequence[Node]) -> dict[str, str]:
    """Waiting cells that no live node can host any more (their GPU type's nodes were lost)."""
    return unplaceable(waiting, nodes)


def lower_bound_makespan(
    cells: Sequence[PlannedCell],
    gpus_by_label: Mapping[str, float],
    duration: Callable[[PlannedCell], float] | None = None,
) -> float:
    """max over GPU types of (GPU-seconds of that type / GPUs of that type): no schedule beats it."""
    duration = duration or (lambda pc: pc.soak_s + pc.startup_s)
    work: dict[str, float] = {}
    for pc in cells:
        work[pc.ray_label] = work.get(pc.ray_label, 0.0) + pc.gpu_count * duration(pc)
    return max((w / gpus_by_label[label] for label, w in work.items() if gpus_by_label.get(label)), default=0.0)
