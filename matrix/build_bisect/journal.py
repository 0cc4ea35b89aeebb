"""How a build bisection's probes and answers go into the probe journal (`matrix/bisect/journal.py`),
so that `soakmatrix bisect --builds ... --resume` replays the answered probes and soaks on from there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from soakmatrix.matrix.bisect.journal import Codec

from .oracle import BuildProbe, BuildProbeResult


def _probe(probe: BuildProbe) -> dict:
    return {"index": probe.index, "build": probe.build, "soak_s": probe.soak_s, "label": f"{probe.build}"}


def _result(result: BuildProbeResult) -> dict:
    return {
        "outcome": result.outcome,
        "signature": result.signature,
        "exposure_s": result.exposure_s,
        "gpu_hours": result.gpu_hours,
        "message": result.message,
        "extra": dict(result.extra),
        "crashed": result.crashed,
    }


def _load(probe: BuildProbe, doc: Mapping[str, Any]) -> BuildProbeResult:
    return BuildProbeResult(
        probe,
        doc["outcome"],
        doc["signature"],
        float(doc["exposure_s"]),
        float(doc["gpu_hours"]),
        doc.get("message", ""),
        doc.get("extra", {}),
        crashed=bool(doc.get("crashed", False)),
    )


BUILD_CODEC = Codec(_probe, _result, _load)
