"""The nodes of a run as its results saw them: each node's preflight (`soakmatrix doctor`, kept in
each result's `preflight`), how many cells ran there and how many it refused. A node whose
preflight failed shows with the checks that failed, so a bad node reads as a bad node, not as a
row of infra errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PREFLIGHT_KEY = "preflight"
STATUS_RANK = {"fail": 0, "warn": 1, "ok": 2}


def node_rows(results: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per node that reported a preflight: worst first, then by name."""
    nodes: dict[str, dict[str, Any]] = {}
    for r in results:
        report = getattr(r, PREFLIGHT_KEY, None) or None
        if not isinstance(report, dict):
            continue
        name = str(report.get("node") or r.node or "?")
        row = nodes.setdefault(
            name,
            {
                "node": name,
                "backend": report.get("backend", ""),
                "status": "ok",
                "problems": [],
                "cells": 0,
                "refused": 0,
            },
        )
        row["cells"] += 1
        checks = report.get("checks") or []
        failed = any(c.get("status") == "fail" for c in checks)
        if failed and r.outcome.value == "infra_error":
            row["refused"] += 1
        for c in checks:
            status = c.get("status", "ok")
            if status == "ok":
                continue
            text = f"{c.get('name', '?')}: {c.get('detail', '')}"
            if text not in row["problems"]:
                row["problems"].append(text)
            if STATUS_RANK.get(status, 2) < STATUS_RANK[row["status"]]:
                row["status"] = status
    return sorted(nodes.values(), key=lambda row: (STATUS_RANK[row["status"]], row["node"]))
