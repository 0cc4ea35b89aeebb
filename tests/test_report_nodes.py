"""The run's nodes as the dashboard shows them: each node's preflight from its cells' results, a
failed node first with what failed and the cells it refused, and the row on the built page."""

from __future__ import annotations

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.dashboard import build_dashboard
from soakmatrix.reports.history import HistoryStore
from soakmatrix.reports.nodes import node_rows

SHM = "/dev/shm 0.1 GiB (0.1 GiB free), under 1.0 GiB: vLLM's shm broadcast and NCCL's shared-memory transport fail"


def preflight(node: str, *checks: tuple[str, str, str]) -> dict:
    return {"node": node, "backend": "vllm", "ok": all(s != "fail" for _, s, _ in checks), "notes": [],
            "checks": [{"name": n, "status": s, "detail": d} for n, s, d in checks]}


GOOD = preflight("gpu-a", ("nvml", "ok", "8 GPU(s)"), ("ptrace", "warn", "kernel.yama.ptrace_scope 1 and no cap"))
BAD = preflight("gpu-b", ("nvml", "ok", "8 GPU(s)"), ("shm", "fail", SHM))


def results() -> list[CellResult]:
    return [
        CellResult("c1", "cell one", "passed", node="gpu-a", preflight=GOOD),
        CellResult("c2", "cell two", "infra_error", node="gpu-b", message="node gpu-b failed its preflight",
                   preflight=BAD),
        CellResult("c3", "cell three", "infra_error", node="gpu-b", preflight=BAD),
        CellResult("c2", "cell two", "hang", node="gpu-a", preflight=GOOD),   # retried elsewhere
        CellResult("c4", "cell four", "passed", node="gpu-c"),                              # run without a preflight
    ]


def test_each_node_once_worst_first_with_what_it_found():
    rows = node_rows(results())
    assert [r["node"] for r in rows] == ["gpu-b", "gpu-a"]
    bad, good = rows
    assert bad == {"node": "gpu-b", "backend": "vllm", "status": "fail", "problems": [f"shm: {SHM}"],
                   "cells": 2, "refused": 2}
    assert good["status"] == "warn" and good["cells"] == 2 and good["refused"] == 0
    assert good["problems"] == ["ptrace: kernel.yama.ptrace_scope 1 and no cap"]


def test_the_dashboard_shows_the_failed_node_in_the_latest_run(tmp_path):
    path = tmp_path / "history.sqlite"
    with HistoryStore(path) as store:
        run = store.start_run(matrix="m.yaml", profile="nightly")
        for r in results():
            store.record(run, r)
        store.finish_run(run, "found")
    page = build_dashboard(path, tmp_path / "site").read_text()
    table = page[page.index('<table id="nodes-table">'):]
    table = table[:table.index("</table>")]
    assert table.index("gpu-b") < table.index("gpu-a")
    assert '<span class="badge p-fail">fail</span>' in table and "shm: /dev/shm 0.1 GiB" in table
