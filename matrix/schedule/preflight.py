"""A run's node preflight: a cell's soak job starts on a node only once that node has passed
`soakmatrix doctor` (jobs/doctor) for the cell's backend. A node that fails gives its cells an
infra_error carrying the doctor's report (the loop retries them on other nodes), never a hang.

Once per node per run: the run's mailbox actor keeps each node's report, keyed by node, backend,
GPU type and engine build; the first cell on a node runs the doctor inside its own task and posts the report,
later cells read it. Two cells starting on a new node at the same moment may both run it (the same
checks, a few seconds). The free-GPU check looks only at the GPUs Ray gave the cell: the node's
others may be running this run's other cells.

The simulated backend runs on fake GPU types and no GPU: the doctor checks it for ptrace alone (a
warning at worst), so sim cells are never refused. The decisions here are pure; the doctor and the
cache are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from soakmatrix.jobs.doctor import GPU_BACKENDS
from soakmatrix.jobs.doctor.checks import FAIL, GpuExpectation
from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.result import CellResult

from .loop import infra_result

# (backend, expectation, GPU indices) -> the doctor's report as a dict (DoctorReport.to_dict)
Diagnose = Callable[[str, "GpuExpectation | None", "Sequence[int] | None"], dict]
PREFLIGHT_KEY = "preflight"  # the result's field that keeps its node's report


def doctor(backend: str, expected: GpuExpectation | None, gpu_indices: Sequence[int] | None) -> dict:
    """The real doctor on this node (the default of a run's tasks): vLLM found, not imported (its
    import costs 10-60 s per node; a broken one fails the cell's start-up anyway)."""
    from soakmatrix.jobs.doctor import run_doctor

    return run_doctor(backend, expected, gpu_indices, full_import=False).to_dict()


def expectation_for(spec: SoakSpec, ray_label: str) -> GpuExpectation | None:
    """What the node must have for this cell: the cell's GPU type and count, for a GPU backend."""
    if spec.backend not in GPU_BACKENDS:
        return None
    return GpuExpectation(spec.gpu_type, ray_label or spec.gpu_type, spec.gpu_count)


def cache_key(node: str, spec: SoakSpec) -> str:
    """A node's report holds for cells of one backend, GPU type and engine build (each build has an
    environment of its own, where vLLM's import is checked)."""
    key = f"{node}|{spec.backend}|{spec.gpu_type}"
    return f"{key}|{spec.build}" if spec.build else key


def gpu_indices(gpu_ids: Sequence[Any]) -> list[int] | None:
    """Ray's GPU ids as NVML indices (None when Ray gave none, or ids that are not indices)."""
    try:
        return [int(g) for g in gpu_ids] or None
    except (TypeError, ValueError):
        return None


def node_report(
    spec: SoakSpec, ray_label: str, cached: Mapping | None, diagnose: Diagnose, gpu_ids: Sequence[Any] = ()
) -> tuple[dict, bool]:
    """(the node's report, whether it was made now) for this cell: the cached one, else the doctor's."""
    if cached is not None:
        return dict(cached), False
    return diagnose(spec.backend, expectation_for(spec, ray_label), gpu_indices(gpu_ids)), True


def failed_checks(report: Mapping) -> list[Mapping]:
    return [c for c in report.get("checks", []) if c.get("status") == FAIL]


def refusal(spec: SoakSpec, report: Mapping, node: str = "") -> CellResult | None:
    """The cell's infra_error when its node failed the preflight (the failed checks in its message,
    the whole report in its `preflight`), else None."""
    failed = failed_checks(report)
    if not failed:
        return None
    where = report.get("node") or node
    detail = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
    result = infra_result(spec, f"node {where} failed its preflight (soakmatrix doctor): {detail}", node=where)
    result.preflight = dict(report)
    return result
