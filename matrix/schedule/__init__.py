"""Scheduling a matrix on Ray: one task per cell on a node with the right GPU type and count.

`placement` decides where a cell can go and in which order cells go out; `loop` is the driver's
loop (`run_cells`) over a `Launcher`; `task` is what runs inside a cell's Ray task; `ray_launcher`
is the Launcher on a real Ray cluster; `cluster` gets that cluster. The names others use are
re-exported here.
"""

from __future__ import annotations

from .cluster_loss import ClusterLost, HeadUnreachable, cluster_lost
from .loop import (
    DEFAULT_CAP_MARGIN_S,
    STOP_GRACE_S,
    Events,
    Launcher,
    Running,
    RunSummary,
    cap_seconds,
    infra_result,
    overran,
    run_cells,
    should_retry,
)
from .placement import (
    ACCELERATOR_PREFIX,
    NODE_ID_LABEL,
    Node,
    avoid_on_retry,
    avoid_selector,
    dispatch_order,
    lower_bound_makespan,
    nodes_from_ray,
    placement_problem,
    stranded,
    unplaceable,
)
from .ray_launcher import RayLauncher
from .task import RunCell, run_with_cap, with_assigned_gpus

__all__ = [
    "ACCELERATOR_PREFIX",
    "DEFAULT_CAP_MARGIN_S",
    "NODE_ID_LABEL",
    "STOP_GRACE_S",
    "ClusterLost",
    "Events",
    "HeadUnreachable",
    "Launcher",
    "Node",
    "RayLauncher",
    "RunCell",
    "RunSummary",
    "Running",
    "avoid_on_retry",
    "avoid_selector",
    "cap_seconds",
    "cluster_lost",
    "dispatch_order",
    "infra_result",
    "lower_bound_makespan",
    "nodes_from_ray",
    "overran",
    "placement_problem",
    "run_cells",
    "run_with_cap",
    "should_retry",
    "stranded",
    "unplaceable",
    "with_assigned_gpus",
]
