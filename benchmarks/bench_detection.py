"""Detection latency and false alarms of the soak job against the simulated engine.

Latency: cells with one planted hang each (`detection_hangs.yaml`, --time-scale 1, small MTTFs),
run through `jobs.soak.run_cell` exactly as a soak runs them; the latency is the verdict's time minus
the moment the simulated engine recorded the hang began (`sim-hangs.jsonl`). False alarms: cells
without hangs but with slow prefills (no chunked prefill, prompts up to 12k tokens: single steps of
several seconds), run until their soak-hours add up; any verdict is a false alarm.

    python -m benchmarks.bench_detection                # 50 hangs per style, 2 soak-hours
    python -m benchmarks.bench_detection --quick        # 3 per style, 6 soak-minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from soakmatrix.jobs.soak import run_cell
from soakmatrix.jobs.soak_spec import SoakSpec
from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE
from soakmatrix.matrix.contracts.workloads import Workload, params_of

HANG_MODEL = Path(__file__).resolve().parent / "detection_hangs.yaml"
STYLE_SEQS = {"silent_stall": 251, "event_sync_stall": 252, "shm_broadcast": 253, "crash": 254}


def workload(name: str, **params) -> Workload:
    defaults = {k: d for k, (_, d) in params_of("random").items()}
    return Workload(name, "random", {**defaults, **params})


def hang_spec(out: Path, style: str, i: int) -> SoakSpec:
    return SoakSpec(
        cell_id=f"{style}-{i}", cell_name=f"sim|bench|{style}|{i}", model="tiny", model_path="tiny",
        gpu_type="H200", gpu_count=1, flags={"max_num_seqs": STYLE_SEQS[style]},
        serve_args=("--max-num-seqs", str(STYLE_SEQS[style])),
        workload=workload("bench", concurrency=8, input_len=[64, 1024], output_len=[16, 256]),
        soak_s=180, startup_timeout_s=120, backend="sim", artifacts_dir=str(out / "hangs" / f"{style}-{i}"),
        hang_model=str(HANG_MODEL), time_scale=1.0, seed=1000 + i)


def prefill_spec(out: Path, i: int, soak_s: float) -> SoakSpec:
    return SoakSpec(
        cell_id=f"prefill-{i}", cell_name=f"sim|bench|slow-prefill|{i}", model="tiny", model_path="tiny",
        gpu_type="H200", gpu_count=1, flags={"chunked_prefill": False},
        serve_args=("--no-enable-chunked-prefill", "--max-model-len", "16384"),
        workload=workload("slow-prefill", concurrency=4, input_len=[256, 12000], output_len=[8, 128]),
        soak_s=soak_s, startup_timeout_s=120, backend="sim", artifacts_dir=str(out / "prefill" / f"p{i}"),
        seed=2000 + i)


def measure_latency(out: Path, styles: Sequence[str], per_style: int, parallel: int) -> list[dict]:
    specs = [hang_spec(out, s, i) for i in range(per_style) for s in styles]
    rows = []

    def one(spec: SoakSpec) -> dict:
        r = run_cell(spec)
        style = spec.cell_id.rsplit("-", 1)[0]
        return {"style": style, "outcome": r.outcome.value, "signature": r.signature,
                "expected": STYLE_SIGNATURE[style], "detector": r.detector,
                "latency_s": r.latency_from_true_start_s, "message": r.message}

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for row in pool.map(one, specs):
            rows.append(row)
            print(f"  {row['style']:<17} {row['outcome']:<6} {str(row['signature']):<22} "
                  f"{row['detector'] or '-':<9} {row['latency_s']}", flush=True)
    return rows


def measure_false_alarms(out: Path, hours: float, parallel: int, cell_s: float) -> list[dict]:
    cells = max(1, round(hours * 3600 / cell_s))
    rows = []

    def one(i: int) -> dict:
        r = run_cell(prefill_spec(out, i, cell_s))
        load = r.load
        return {"cell": i, "outcome": r.outcome.value, "exposure_s": r.exposure_s, "message": r.message,
                "gap_max_s": load.get("gap_max_s"), "ttft_p99_s": load.get("ttft_p99_s")}

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for row in pool.map(one, range(cells)):
            rows.append(row)
            print(f"  cell {row['cell']:>3}: {row['outcome']:<11} exposure {row['exposure_s']:.0f} s, "
                  f"longest client gap {row['gap_max_s'] or 0:.1f} s", flush=True)
    return rows


def summarise(latency: list[dict], alarms: list[dict]) -> str:
    lines = []
    if latency:
        lines += ["", "Detection latency from the hang's true start (simulated engine, --time-scale 1)", "",
                  f"{'style':<17} {'hangs':>5} {'found':>5} {'sig ok':>6} {'median s':>9} {'p90 s':>7} "
                  f"{'worst s':>8}  detectors"]
    for style in dict.fromkeys(r["style"] for r in latency):
        rows = [r for r in latency if r["style"] == style]
        found = [r for r in rows if r["outcome"] in ("hang", "crash") and r["latency_s"] is not None]
        lat = sorted(r["latency_s"] for r in found)
        ok = sum(r["signature"] == r["expected"] for r in rows)
        dets: dict[str, int] = {}
        for r in found:
            dets[r["detector"]] = dets.get(r["detector"], 0) + 1
        p90 = lat[min(len(lat) - 1, int(0.9 * len(lat)))] if lat else float("nan")
        lines.append(f"{style:<17} {len(rows):>5} {len(found):>5} {ok:>6} "
                     f"{statistics.median(lat) if lat else float('nan'):>9.1f} {p90:>7.1f} "
                     f"{max(lat) if lat else float('nan'):>8.1f}  "
                     + ", ".join(f"{k} {v}" for k, v in sorted(dets.items())))
    if latency:
        all_lat = sorted(r["latency_s"] for r in latency if r["latency_s"] is not None)
        if all_lat:
            lines.append(f"{'all':<17} {len(latency):>5} {len(all_lat):>5} "
                         f"{sum(r['signature'] == r['expected'] for r in latency):>6} "
                         f"{statistics.median(all_lat):>9.1f} {all_lat[int(0.9 * (len(all_lat) - 1))]:>7.1f} "
                         f"{max(all_lat):>8.1f}")
    if alarms:
        hours = sum(r["exposure_s"] for r in alarms) / 3600
        false = [r for r in alarms if r["outcome"] in ("hang", "crash")]
        other = [r for r in alarms if r["outcome"] not in ("hang", "crash", "passed")]
        gaps = [r["gap_max_s"] for r in alarms if r["gap_max_s"]]
        lines += ["", "False alarms with slow prefills (no chunked prefill, prompts 256-12000 tokens)", "",
                  f"{'cells':>5} {'soak h':>7} {'longest gap s':>13} {'false alarms':>12} {'no verdict':>10}",
                  f"{len(alarms):>5} {hours:>7.2f} {max(gaps, default=0):>13.1f} {len(false):>12} {len(other):>10}"]
        for r in false:
            lines.append(f"  false alarm: {r['message']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_detection", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 hangs per style, 6 soak-minutes of false-alarm run")
    p.add_argument("--per-style", type=int, default=50)
    p.add_argument("--styles", default=",".join(STYLE_SEQS))
    p.add_argument("--false-alarm-hours", type=float, default=2.0)
    p.add_argument("--cell-minutes", type=float, default=20.0, help="length of one false-alarm cell")
    p.add_argument("--parallel", type=int, default=3, help="cells at once (hang cells)")
    p.add_argument("--alarm-parallel", type=int, default=6, help="cells at once (false-alarm cells)")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-false-alarms", action="store_true")
    p.add_argument("--out", help="keep the cells' artifacts here (default: a temporary folder)")
    p.add_argument("--json", help="write every row to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.per_style, args.false_alarm_hours, args.cell_minutes = 3, 0.1, 3.0
    out_ctx = tempfile.TemporaryDirectory(prefix="bench-detection-") if not args.out else None
    out = Path(args.out or out_ctx.name)
    t0 = time.monotonic()
    latency = [] if args.skip_latency else measure_latency(
        out, [s for s in args.styles.split(",") if s], args.per_style, args.parallel)
    alarms = [] if args.skip_false_alarms else measure_false_alarms(
        out, args.false_alarm_hours, args.alarm_parallel, args.cell_minutes * 60)
    print(summarise(latency, alarms))
    print(f"\n(wall time {time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"latency": latency, "false_alarms": alarms}, indent=1))
    if out_ctx is not None:
        out_ctx.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
