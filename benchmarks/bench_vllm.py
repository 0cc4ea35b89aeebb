"""The real engine's numbers on this machine: start-up to ready, the watchdog's detection latency on a
planted hang, and false alarms over a healthy soak (10 minutes; `--quick`: 2).

    python -m benchmarks.bench_vllm [--quick] [--stalls N] [--soak-s S] [--out DIR]
    python -m benchmarks.bench_vllm --bisect      # flag bisection on the real engine (about 40 min)

Every run goes through the soak job (`jobs.soak.run_cell`) with `VllmEngine`, the tiny model and the
CPU demo matrix (fixtures/vllm_cpu.yaml), exactly as `soakmatrix run --backend vllm` does.
Detection latency is measured from the moment the fault plugin planted the hang (its hang record)
to the watchdog's verdict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "fixtures" / "vllm_cpu.yaml"


def _spec(matrix, cell_flags: dict, out: Path, soak_s: float, hang_model: str | None, seed: int):
    from soakmatrix.jobs.soak_spec import SoakSpec
    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.soak_specs import soak_spec_for

    cell = next(pc for pc in plan(matrix).cells if pc.cell.flag_dict == cell_flags)
    return soak_spec_for(cell, matrix, backend="vllm", out_dir=out, soak_s=soak_s,
                                 hang_model=hang_model, seed=seed, startup_timeout_s=600)


def run(soak_s: float, stalls: int, out: Path) -> list[dict]:
    from soakmatrix.jobs.soak import run_cell
    from soakmatrix.matrix.spec import load_matrix

    matrix = load_matrix(MATRIX)
    rows = []
    healthy = run_cell(_spec(matrix, {"prefix_caching": True, "enforce_eager": False}, out / "healthy",
                             soak_s, None, 0))
    rows.append({"run": "healthy soak", "outcome": healthy.outcome.value,
                 "startup_s": healthy.startup_s, "exposure_s": round(healthy.exposure_s, 1),
                 "tokens": healthy.tokens, "false_alarms": int(healthy.outcome.value != "passed"),
                 "latency_s": None, "signature": healthy.signature})
    hang_model = str(REPO / "fixtures" / "hangs" / "vllm_cpu.yaml")
    for i in range(stalls):
        r = run_cell(_spec(matrix, {"prefix_caching": False, "enforce_eager": False}, out / f"stall-{i}",
                           300.0, hang_model, seed=i))
        rows.append({"run": f"planted silent_stall #{i + 1}", "outcome": r.outcome.value,
                     "startup_s": r.startup_s, "exposure_s": round(r.exposure_s, 1),
                     "tokens": r.tokens, "false_alarms": 0,
                     "latency_s": r.latency_from_true_start_s, "signature": r.signature})
    return rows


BISECT_CELL = "d5e6f16b3e32"   # fixtures/vllm_cpu_bisect.yaml's failing cell


def bisect(out: Path) -> int:
    """`soakmatrix bisect --backend vllm` over five CPU-meaningful flags with a planted two-flag trigger
    (prefix_caching=false AND chunked_prefill=false); prints the minimal set, probes and wall time."""
    import subprocess

    t0 = time.time()
    cmd = [sys.executable, "-m", "soakmatrix.fixtures.cpu_ray", sys.executable, "-m", "soakmatrix.matrix.cli",
           "bisect", str(REPO / "fixtures" / "vllm_cpu_bisect.yaml"), "--cell", BISECT_CELL, "--backend", "vllm",
           "--mttf-cap", "30s", "--no-shrink", "--parallel", "1", "--out", str(out / "bisect"), "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    text = run.stdout[run.stdout.find("{"):]
    result = json.loads(text) if text else {}
    print(f"status {result.get('status')}, minimal set {result.get('minimal')} (planted: "
          f"['chunked_prefill', 'prefix_caching']), {result.get('probes')} probes, "
          f"{time.time() - t0:.0f} s wall, exit {run.returncode}")
    for verdict in result.get("verdicts", []):
        print(f"  {verdict['flag']:<16} {verdict['text']}")
    return 0 if result.get("minimal") == ["chunked_prefill", "prefix_caching"] else 1


def table(rows: list[dict]) -> str:
    cols = ["run", "outcome", "signature", "startup_s", "exposure_s", "tokens", "latency_s", "false_alarms"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    starts = [r["startup_s"] for r in rows if r["startup_s"] is not None]
    lat = [r["latency_s"] for r in rows if r["latency_s"] is not None]
    if starts:
        lines.append(f"start-up to ready: min {min(starts):.1f} s, median {statistics.median(starts):.1f} s, "
                     f"max {max(starts):.1f} s over {len(starts)} starts")
    if lat:
        lines.append(f"detection latency (planted -> verdict): min {min(lat):.1f} s, "
                     f"median {statistics.median(lat):.1f} s, max {max(lat):.1f} s over {len(lat)} hangs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_vllm", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2-minute healthy soak, one planted stall")
    parser.add_argument("--soak-s", type=float, help="healthy soak length (default 600, quick 120)")
    parser.add_argument("--stalls", type=int, help="planted silent stalls to time (default 3, quick 1)")
    parser.add_argument("--out", help="artifacts folder (default: a temporary folder)")
    parser.add_argument("--bisect", action="store_true", help="run the real-engine flag bisection instead")
    args = parser.parse_args(argv)
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"bench_vllm: skipped, vLLM is not importable ({exc}); run `make install-vllm`")
        return 0
    soak_s = args.soak_s or (120.0 if args.quick else 600.0)
    stalls = args.stalls if args.stalls is not None else (1 if args.quick else 3)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    if args.bisect:
        return bisect(out)
    t0 = time.time()
    rows = run(soak_s, stalls, out)
    print(table(rows))
    print(f"({time.time() - t0:.0f} s wall; artifacts in {out})")
    (out / "bench_vllm.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
